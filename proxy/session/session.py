"""One session: what outlives a socket, and the participants attached to it (docs/protocol.md
§2–3, §7–9).

A `ProxySession` is one Triton sequence translated onto WebSockets. It holds what survives a
dropped connection or a move to another Triton, each part in its own module:

- its `Lifecycle` (rtvideo.proxy.session.lifecycle): the `Phase`, and the model's request_id;
- its `Upstream` (rtvideo.proxy.session.upstream): the Triton stream and what is in flight on it;
  a move to another Triton (`move`, rtvideo.proxy.session.mover) takes the stream over, nothing else;
- its event book, written by its `Ledger` alone (rtvideo.proxy.session.ledger) and decided on by
  its `ProxyAcks` (rtvideo.proxy.session.acks): every `session.done` a client gets has that book's lists;
- its `Dispatch` (rtvideo.proxy.session.dispatch): replies written to the owner, in the order
  rtvideo.proxy.session.ordering keeps;
- its `Handouts` (rtvideo.proxy.participants.handouts): what the owner was handed, followed by the replay
  buffer, the watchers and any recording sink (`Handouts.record_to`);
- its `Invitations` (rtvideo.proxy.participants.invitations): the resume and watch tokens, the grace.
- its `Steering` (rtvideo.proxy.session.steering): what a steering participant's frames do;
- its `Attachments` (rtvideo.proxy.session.attachments): participants coming and going;
- its `Ending` (rtvideo.proxy.session.ending): the ends the proxy reports itself, and the close.

Its participants (rtvideo.proxy.participants.links) each hold one link, with its outbox and its
bounds: the `Owner`, whose frames steer the session and who is handed every reply, read-only
watchers (rtvideo.proxy.participants.watchers), and guest steerers
(rtvideo.proxy.participants.steerers), whose frames steer it too.

The session owns its phase and wires its parts once, here; it holds no pass-through for a
door (what it keeps that reads a part is the session's own: `move` gives the mover its phase
and stream; `peer`, `owner`, `request_id` and `closed` are what the handler reads of it). A
door reaches the part it needs through a typed read-only property: the owner's and a guest
steerer's frames go to `steering.frame` (rtvideo.proxy.edge.socket, rtvideo.proxy.edge.guest_doors),
a watch or steer link attaches through `attachments` (the seams `WatchDoor`, `SteerDoor` of
rtvideo.proxy.participants.features, which its tokens open), and a recording sink follows
`handouts`. What moves the phase stays a method of the session: `begin`, `attach_owner` (a
resume), `take_over`, `move`, the ends. A session is made by a connection's `session.start`
(rtvideo.proxy.edge.socket), or by a resume of a session another replica held
(rtvideo.proxy.continuity.takeover).

Its phase and request id are written here alone (`Lifecycle`); its parts read them and tell
it what happened by their return values or a narrow typed seam that names what they use
(`SteeredSession`: stop, the wait for the store, paced; `DispatchedSession`: video.start,
the model's done, a slow consumer). Parts that need each other's state get the part at
wiring time (the figures of `InbandMetrics` read the phase, the playhead and the event book;
steering shares through the invitations' hubs), not through the session.

Each session ends exactly once: the model's `session.done`, or an end the proxy reports
itself (`start_timeout`, `invalid_start`, `slow_consumer`, `backend_unavailable`,
`server_shutdown`), or the owner going away. In every case the Triton sequence is ended
before the stream is dropped, so its slot is freed: `session.stop` with `sequence_end`, then
the request stream is half-closed, and Triton ends the call once every request completed.
A resumable session whose owner's connection drops is detached instead: its sequence stays
open, the model pauses it, and a `session.resume` attaches a new owner with nothing lost.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from rtvideo.core.errors import ErrorCode, ProtocolError
from rtvideo.core.resume import ResumeRefused
from rtvideo.proxy.continuity.record import SavedSession
from rtvideo.proxy.continuity.writer import Continuity
from rtvideo.proxy.frames import Frame
from rtvideo.proxy.observability.inband import InbandMetrics
from rtvideo.proxy.observability.metrics import ProxyMetrics
from rtvideo.proxy.observability.session_timing import PlayheadTiming, StreamTiming
from rtvideo.proxy.observability.tracing import session_trace
from rtvideo.proxy.participants.features import Features
from rtvideo.proxy.participants.handouts import Handouts
from rtvideo.proxy.participants.invitations import Invitations
from rtvideo.proxy.participants.links import Owner
from rtvideo.proxy.participants.seat import OwnerSeat
from rtvideo.proxy.phase import LIVE, Phase
from rtvideo.proxy.placement.bridge import END_GRACE_SECONDS
from rtvideo.proxy.placement.streams import StreamSource
from rtvideo.proxy.session.acks import ProxyAcks
from rtvideo.proxy.session.attachments import Attachments
from rtvideo.proxy.session.dispatch import Dispatch
from rtvideo.proxy.session.ending import Ending
from rtvideo.proxy.session.ledger import Ledger
from rtvideo.proxy.session.lifecycle import Lifecycle
from rtvideo.proxy.session.mover import Mover, MoveReason
from rtvideo.proxy.session.restore import restore_log
from rtvideo.proxy.session.steering import Steering
from rtvideo.proxy.session.upstream import Upstream, UpstreamTimes
from rtvideo.proxy.settings import ProxySettings
from rtvideo.proxy.store.keeper import StoreKeeper
from rtvideo.proxy.tasks import TaskSet
from rtvideo.triton.wire import Reply

log = logging.getLogger(__name__)

#: how long a chunk may wait for the ack of an event it names (the ack is already on its way)
ACK_WAIT_SECONDS = 1.0
#: at most one client session.ping a second goes on to Triton (it resets the model's stall clock)
PING_FORWARD_SECONDS = 1.0
#: a live session's sequence that had no request forwarded for this long gets a keep-alive, so
#: Triton's idle timeout (120 s, docs/protocol.md §8) never ends it
KEEPALIVE_SECONDS = 30.0


class ProxySession:
    """One session and its participants; every method runs on the proxy's event loop."""

    def __init__(
        self,
        owner: Owner,
        bridge: StreamSource,
        settings: ProxySettings,
        metrics: ProxyMetrics,
        on_closed: Callable[[ProxySession], None],
        features: Features | None = None,
        keeper: StoreKeeper | None = None,
    ) -> None:
        """A session for `owner`, whose connection's first message was a valid `session.start`
        (`begin` is given it next)."""
        self._bridge = bridge
        self._settings = settings
        self.metrics = metrics
        self._on_closed = on_closed
        #: its writes to a shared session store (rtvideo.proxy.continuity.writer): none with one proxy alone
        self._continuity = Continuity(keeper, self._keeps_owner)
        #: after a takeover whose store lagged the chunks in flight: the owner already has the
        #: pairs through this transport index; those made again are not written to it (`take_over`)
        self._owner_has_through: int | None = None
        self._life = Lifecycle()
        self.tasks = TaskSet()
        self.ledger = Ledger()  # what the owner was handed; its EventBook's one writer
        self._acks = ProxyAcks(self.ledger)
        self._seat = OwnerSeat(owner, metrics, self._taken)
        self._handouts = Handouts()
        self._invites = Invitations(features, settings, metrics)
        #: the model paces this session to its playhead (video.start's `config.streaming_pacing`):
        #: then acks carry `received_at`, as vLLM-Omni 0.32's do (docs/protocol.md §3.1)
        self.paced = False
        self._timing = StreamTiming(metrics)  # time to first chunk, chunk lead
        self._trace = session_trace(settings.otlp_endpoint, settings.model)  # rtvideo.proxy.observability.tracing
        self._playhead = PlayheadTiming(metrics, on_shown=self._trace.on_screen)  # on-screen latency and lead
        bound = settings.outbound_buffer_bytes
        self._dispatch = Dispatch(
            self._life,
            ACK_WAIT_SECONDS,
            bound,
            self._seat,
            self._acks,
            metrics,
            self._playhead,
            self,
            ledger=self.ledger,
            invites=self._invites,
        )
        times = UpstreamTimes(KEEPALIVE_SECONDS, PING_FORWARD_SECONDS, END_GRACE_SECONDS)
        # rtvideo.proxy.session.mover: its log keeps the admitted events, within the session's bound
        self._mover = Mover(
            bridge, settings.move_patience_seconds, metrics, self.ledger.book, settings.session_store_bytes
        )
        self.upstream = Upstream(
            self._life, settings, times, self.tasks, self.on_reply, self._stream_broke, self._mover.forwarded
        )
        # session.metrics, when the start asks (rtvideo.proxy.observability.inband)
        self._inband = InbandMetrics(self._dispatch.answer, self._life, self._playhead, self.ledger.book)
        self._steering = Steering(
            self,
            self._life,
            settings,
            self.upstream,
            self._acks,
            self._dispatch,
            self._playhead,
            metrics,
            invites=self._invites,
            continuity=self._continuity,
            trace=self._trace,
        )
        self._ending = Ending(self._life, self.tasks, self._seat, self.ledger, self.upstream)
        self._attachments = Attachments(self, self._life, self._seat, self._invites, self._handouts, self.upstream)
        metrics.session_opened()

    # --- what the handler and the doors read --------------------------------------------------
    @property
    def peer(self) -> str:
        return self._seat.owner.peer

    @property
    def request_id(self) -> str | None:
        return self._life.request_id

    @property
    def owner(self) -> Owner:
        return self._seat.owner

    @property
    def closed(self) -> asyncio.Event:
        return self._life.closed

    @property
    def starting(self) -> bool:
        """Made by a start whose sequence is not open yet (a branch reads its recording first)."""
        return self._life.phase is Phase.AWAITING_START

    @property
    def continuable(self) -> bool:
        """Whether another replica can go on with it (a shared store, and a resume token)."""
        return self._continuity.continuable and self._invites.resumable and self._life.live

    @property
    def detached(self) -> bool:
        return self._life.phase is Phase.DETACHED

    # --- the parts the doors reach (the seams of rtvideo.proxy.participants.features) ---------
    @property
    def steering(self) -> Steering:
        """Where a steering participant's frames go: the owner's (rtvideo.proxy.edge.socket), and
        a guest steerer's (rtvideo.proxy.edge.guest_doors)."""
        return self._steering

    @property
    def attachments(self) -> Attachments:
        """How participants come and go: what a resume, a watch or a steer token opens."""
        return self._attachments

    @property
    def handouts(self) -> Handouts:
        """What the owner is handed, and what follows it (a recording sink, `Handouts.record_to`)."""
        return self._handouts

    # --- participants → Triton ----------------------------------------------------------------
    def begin(self, first: dict[str, Any], raw: bytes) -> Awaitable[None] | None:
        """The session.start that made this session (parsed and bounded by the connection); a
        branch (`from_recording`) reads its recording first, and the next frame is read only once
        its sequence is open (the returned task)."""
        try:
            self._inband.asked(first)
            start = self._invites.take_options(first, raw, self._handouts)
        except ProtocolError as exc:
            self._fail(exc.code, exc.message)
            return None
        if self._invites.branching:
            return self.tasks.spawn(self._open_branch(first))
        self._open(start)
        return None

    async def _open_branch(self, given: dict[str, Any]) -> None:
        try:
            start = await self._invites.branch_start(given)
        except ProtocolError as exc:
            self._fail(exc.code, exc.message)
            return
        if self.starting:  # not ended while its recording was read
            self._open(start)

    # --- what steering asks of the session (SteeredSession) ----------------------------------
    def stop(self) -> None:
        """The owner's session.stop: STREAMING → STOP_SENT, with sequence_end going to Triton once."""
        if self._life.phase is Phase.STREAMING:
            self.upstream.send_stop()
            self._life.stop_sent()

    def when_kept(self, raw: bytes | None, kept: Callable[[], None], refused: Callable[[], None] | None = None) -> None:
        waiting = self._continuity.event(raw)
        if waiting is None:
            kept()
        else:
            self.tasks.spawn(self._when_kept(waiting, kept, refused or kept))

    async def _when_kept(self, waiting: Awaitable[bool], kept: Callable[[], None], refused: Callable[[], None]) -> None:
        ok = await waiting  # the keeper's writes go in order: so do the forwards and acks that wait for them
        if self._life.live:
            (kept if ok else refused)()

    # --- the sequence: opened, held by this replica, taken over, moved -------------------------
    async def _watch_lease(self) -> None:
        """Another replica holds the session now: this one stops driving it. Its owner is closed
        with 1012 (Service Restart) and resumes there; its sequence here is ended."""
        lost = self._continuity.lost
        if lost is None:
            return
        waits = [asyncio.ensure_future(lost.wait()), asyncio.ensure_future(self._life.closed.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
        if lost.is_set() and self._life.claim_end():
            log.warning("request_id=%s continued by another proxy: letting go", self.request_id)
            self._continuity.keep_record()
            self.tasks.spawn(self._let_go())

    async def _let_go(self) -> None:
        await self.upstream.end()
        self._seat.owner.close(1012, "continued by another proxy; resume")
        if self._seat.gone:
            self.on_disconnect()

    def _open(self, start: bytes) -> None:
        self._continuity.opened(start, durable=self._invites.asks_resume)
        self.tasks.spawn(self._watch_lease())
        with self._trace.begin():  # the stream (and its pump's later ones) carries the traceparent
            stream = self._bridge.open_stream()
            self._timing.started()
            stream.send(start, start=True)
            self._mover.opened(start)
            self._life.open_sequence()
            self.upstream.open(stream)

    def take_over(self, saved: SavedSession, last: int, token: str) -> None:
        """This new session is `saved`, which another proxy held (rtvideo.proxy.continuity.takeover):
        its parts rebuilt from what the store kept, in order; its owner (the constructor's, back
        with `token` from the pair `last`) is given what a resume gives; its stream goes on at the
        next chunk (a move). ResumeRefused (nothing started) when the chunks after `last` are gone."""
        assert self._continuity.shared and self._life.phase is Phase.AWAITING_START
        self._life.named(saved.request_id)
        self._trace.named(saved.request_id)
        self._invites.restore(self, self._handouts, saved, token)
        self._handouts.restore(saved.handed_start, saved.init)
        self._invites.replayable(*restore_log(saved, self.ledger, self._mover, self._acks), self._handouts)
        self._dispatch.taken_over(saved.acked())
        self._continuity.adopted(saved)
        kept = -1 if self.ledger.last_transport is None else self.ledger.last_transport
        if last > kept:  # the client has chunks its proxy sent before their write (takeover.py `_check`)
            self._owner_has_through = last
            log.info(
                "request_id=%s the client has chunks %d..%d that the store did not keep yet: made again, not sent",
                saved.request_id,
                kept + 1,
                last,
            )
        self._attachments.reseat(self._seat.owner, min(last, kept), token)
        self._life.open_sequence()
        self._continuity.tokens(self._invites.token_hashes())
        self.tasks.spawn(self._watch_lease())
        log.info("request_id=%s peer=%s taken over after index %d", self.request_id, self.peer, last)
        if not self.move(MoveReason.TAKEOVER):
            self._fail(ErrorCode.BACKEND_UNAVAILABLE, "the session could not be continued here; start a new one")

    def move(self, reason: MoveReason) -> bool:
        """Go on on another Triton (rtvideo.proxy.session.mover); its participants, event book and
        replay buffer stay. False when it cannot: it is not live, or its state cannot be rebuilt."""
        return self._mover.move(reason, self._life, self.upstream)

    # --- Triton → the owner -------------------------------------------------------------------
    def on_reply(self, reply: Reply) -> None:
        """One reply of the session's Triton stream, as its `Upstream` pump reads it."""
        if not self.upstream.received(reply):  # flags-only, or the answer to a request of the proxy's own
            return
        spliced = self._mover.arrived(reply)  # in the session's coordinates after a move
        if spliced is not None:
            self._inband.arrived(spliced.message)
            self._dispatch.received(spliced, answers_stop=self.upstream.answers_stop(spliced.tag))

    def _stream_broke(self, reason: str) -> None:
        """The stream failed (or fell silent) while the session is live: it moves to another
        Triton, or when it cannot, ends with backend_unavailable."""
        if self.move(MoveReason.LOSS):
            log.warning("request_id=%s peer=%s moving after a backend failure: %s", self.request_id, self.peer, reason)
            return
        log.warning("request_id=%s peer=%s backend failure: %s", self.request_id, self.peer, reason)
        self._fail(ErrorCode.BACKEND_UNAVAILABLE, "the video backend is unavailable; try again later")

    # --- what dispatch tells the session (DispatchedSession) ----------------------------------
    def started(self, message: dict[str, Any], text: str) -> tuple[dict[str, Any], str]:
        """The model's video.start, about to be written: the session has its name, and the owner
        is offered the tokens its start asked for."""
        self._life.named(message.get("request_id"))
        self._trace.named(self._life.request_id)
        config = message.get("config")
        self.paced = isinstance(config, dict) and isinstance(config.get("streaming_pacing"), dict)
        log.info("request_id=%s peer=%s session started", self.request_id, self.peer)
        offered = self._invites.offer(self, self._handouts, message, text)
        if self._continuity.shared:
            handed = self._handouts.start_for() or message  # as handed out, without tokens
            fields = {
                "request_id": str(self._life.request_id),
                "handed_start": json.dumps(handed),
                "options": json.dumps(self._invites.options),
                "recording_id": self._invites.recording_id or "",
                "broadcast_id": self._invites.broadcast_id or "",
            }
            self._continuity.started(fields, self._invites.token_hashes())
        return offered

    def model_done(self) -> None:
        """The model's session.done was queued for the owner: the end (once the owner is back,
        when it is detached: a resume or the grace)."""
        if self.detached:
            self._life.done_arrived_detached()
        elif self._life.claim_end():
            self._finish()

    def slow_consumer(self) -> None:
        self._fail(
            ErrorCode.SLOW_CONSUMER,
            f"the client reads too slowly: more than {self._settings.outbound_buffer_bytes} bytes are waiting",
        )

    def _taken(self, frame: Frame) -> Frame | None:
        """A frame handed to the owner's socket; returns what is written (a done with the book's
        lists; None: nothing, a chunk made again after a takeover that the client has already)."""
        if frame.replay:
            return frame  # sent again after a resume: the ledger and the timing saw it the first time
        frame = self.ledger.taken(frame)
        self._timing.taken(frame.message)
        self._playhead.taken(frame.message)
        self._inband.taken(frame.message)
        self._trace.taken(frame.message)
        self._dispatch.handed_out(frame.message)
        self._handouts.handed_out(frame)
        self._continuity.taken(frame)
        index = frame.message.get("transport_chunk_index") if frame.data is not None else None
        if isinstance(index, int) and self._owner_has_through is not None and index <= self._owner_has_through:
            return None  # seen by every part of the session as handed out; the client has its copy
        return frame

    # --- ending (rtvideo.proxy.session.ending) -------------------------------------------------------
    def _fail(self, code: ErrorCode, message: str, close_code: int = 1000) -> None:
        """End the session from the proxy's side: claimed at once, reported by a task."""
        if self._life.claim_end():
            self._ending.report(code, message, close_code).add_done_callback(self._ended_detached)

    def _finish(self) -> None:
        """The end is claimed and the owner's last message is queued."""
        self._ending.finish_soon().add_done_callback(self._ended_detached)

    def _ended_detached(self, _: object) -> None:
        """An end reported while detached: no connection will report its close, so it is over now."""
        if self._seat.gone:
            self.on_disconnect()

    def on_invalid_text(self) -> None:
        """A text frame that is not UTF-8 breaks the WebSocket contract (RFC 6455 §8.1): the
        error and a complete `session.done` while the socket still takes them, then close 1007."""
        code = ErrorCode.INVALID_START if self.starting else ErrorCode.INVALID_JSON
        self._fail(code, "a text frame was not valid UTF-8; closing (1007)", close_code=1007)

    def on_disconnect(self, *, dropped: bool = False) -> None:
        """The owner's WebSocket is closed (by either side): free everything, exactly once.
        `dropped`: it went without a close frame or with a code other than 1000; a resumable
        session is then detached instead."""
        if dropped and self._attachments.may_detach():
            self._life.detach()
            self._attachments.detached(self._grace_over)
            self._continuity.away(True)  # a replica taking it over counts the grace from here
            return
        left = self._life.mark_closed()
        if left is Phase.CLOSED:
            return
        self._dispatch.stop()
        self.upstream.stop_timers()
        self._seat.owner.close_outbox()
        if left in LIVE:  # no end was claimed: the sequence is still open
            self.tasks.spawn(self.upstream.end())
        self.metrics.sessions_active.dec()
        self._playhead.finish()
        self._trace.end()
        self._invites.close(handed_off=self._continuity.handed_off)
        self._handouts.ended()
        self.tasks.spawn(self._continuity.end())  # its record goes, unless handed off
        log.info(
            "request_id=%s peer=%s session ended chunks=%d after %.1f s",
            self.request_id,
            self.peer,
            self.ledger.chunks,
            self._life.waited,
        )
        self._on_closed(self)

    async def hand_off(self, timeout: float) -> None:
        """Shutdown with a shared store (docs/operations.md "Rolling updates"): nothing more handed
        out, the owner closed with 1012, the writes finished, the lease released (the record stays
        for the replica it resumes through), the sequence here ended (its Triton slot freed)."""
        if not self._continuity.continuable or not self._life.claim_end():
            await self._ending.closed_within(timeout)
            return
        self._dispatch.stop()
        # handed off before the owner's link is closed: its close may end the session here at
        # once (on_disconnect), which must keep the record and send the guests on (1012)
        self._continuity.keep_record()
        self._seat.owner.close(1012, "the server restarts; resume")
        await self._continuity.hand_off()
        await self.upstream.end()
        if self._seat.gone:
            self.on_disconnect()
        await self._ending.closed_within(timeout)

    def untaken(self) -> None:
        """A takeover that could not be completed: the session is closed here, its record kept."""
        self._continuity.keep_record()
        self.on_disconnect()

    async def shutdown(self, timeout: float) -> None:
        """Server shutdown (after the drain): `server_shutdown`, a complete `session.done` and close
        1001; the sequence is ended on Triton as for any end. An end already under way goes on."""
        self._fail(ErrorCode.SERVER_SHUTDOWN, "the server is shutting down; reconnect to go on", close_code=1001)
        await self._ending.closed_within(timeout)

    # --- attaching participants (rtvideo.proxy.session.attachments) ------------------------------------
    async def _keeps_owner(self) -> bool:
        """A resume at another replica asks for this session: it stays while its owner is attached
        and answers a ping (one controller at a time, docs/protocol.md §9.1); an owner that does not
        answer is taken for dropped (the session detaches) and the session is handed over."""
        await self._attachments.drop_if_silent(self._settings.resume_probe_seconds)
        return self._life.attached

    async def check_held(self) -> None:
        """Before a resume attaches here (docs/decisions.md "The session store under faults"):
        ResumeRefused unless the session waits for a new owner and this replica still drives it,
        its lease and epoch checked in a shared store, so a token never brings it to life twice."""
        self._attachments.check_resume()
        if not await self._continuity.held_here():
            if self._continuity.lost is not None and self._continuity.lost.is_set():
                raise ResumeRefused("the session is continued by another proxy")
            raise ResumeRefused("the session store cannot confirm that this proxy holds the session; resume again")

    def attach_owner(self, owner: Owner, last: int, token: str) -> None:
        """DETACHED → STREAMING with `owner` (a resume), who is given what it may have lost;
        ResumeRefused (nothing changes) when it cannot. A session the model ended meanwhile
        tells the new owner and ends."""
        self._attachments.check_resume()
        self._attachments.reseat(owner, last, token)
        self._life.reattach()
        self._continuity.away(False)
        self._continuity.tokens(self._invites.token_hashes())  # the fresh resume token
        if self._life.done_while_detached and self._life.claim_end():  # ended while detached: now told
            self._finish()
            return
        self._attachments.resumed()

    def _grace_over(self) -> None:
        if self._life.phase is Phase.DETACHED and self._invites.enabled:
            log.info("request_id=%s not resumed within the grace: ending", self._life.request_id)
            self._invites.expire()
            self.on_disconnect()
