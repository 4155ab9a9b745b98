"""What a steering participant's frames do to its session once the sequence is open
(docs/protocol.md §2, §7).

The proxy checks only what it must answer itself (size, JSON, type, binary frames) and
forwards every other message verbatim; the model validates the rest. A valid interaction it
acks at once, as the model would (rtvideo.proxy.session.acks). It bounds what one participant can
make it and Triton hold: its own token bucket for the message rate (`Steerer.within_rate`),
and the session's bound on requests in flight. `session.ping` is answered here (at most one
a second goes on, rtvideo.proxy.session.upstream).

Guest steerers (rtvideo.proxy.participants.steerers, docs/protocol.md §9.3) hand their frames to the
same `frame`, with their own bucket and their own share of the in-flight bound
(`in_flight_share`). What answers a guest's message goes to that guest alone (`Steerer.guest`,
routed by rtvideo.proxy.session.dispatch). Only the owner may end the session (`session.stop`) or
revoke steering (`session.revoke_steering`): from a guest either is `invalid_message`. A
guest's well-formed `session.playback` is dropped (only the owner's playhead paces the stream)
and not counted among its messages.

Every participant sees the same story (docs/protocol.md §9.4): an interaction acked here for
the first time is told to the session's other participants (`_tell_others`: the owner, the other
steerers, the watchers) as `session.interaction.shared`, before its sender's ack goes out, so
their chunk lists name an event they already know.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from rtvideo.core import protocol, server_messages
from rtvideo.core.errors import ErrorCode, ProtocolError
from rtvideo.proxy.continuity.writer import Continuity
from rtvideo.proxy.frames import Frame
from rtvideo.proxy.limits import event_id_in, over_rate_stop, refused_event_id
from rtvideo.proxy.observability.metrics import ProxyMetrics
from rtvideo.proxy.observability.session_timing import PlayheadTiming
from rtvideo.proxy.observability.tracing import NO_TRACE, SessionTrace
from rtvideo.proxy.participants.invitations import Invitations
from rtvideo.proxy.participants.links import Guest, Steerer
from rtvideo.proxy.participants.steerers import in_flight_share
from rtvideo.proxy.phase import Phase, SessionPhase
from rtvideo.proxy.session.acks import Ack, ProxyAcks
from rtvideo.proxy.session.dispatch import Dispatch
from rtvideo.proxy.session.upstream import Upstream
from rtvideo.proxy.settings import ProxySettings

#: after a frame over the rate, the client's next frame is read this much later: a flooding client
#: costs the proxy at most about 1,000 answered frames a second and meets TCP backpressure
#: beyond, while what it has already pushed into its socket is still drained and answered
OVER_RATE_READ_PAUSE_SECONDS = 0.001


class SteeredSession(Protocol):
    """What steering asks of the session it steers (`ProxySession`): what moves its phase, the
    wait for the session store (on the session's tasks, while it is live), and what the model's
    video.start said of it."""

    def stop(self) -> None:
        """The owner's session.stop: sequence_end goes to Triton once, and the session moves on."""

    def when_kept(self, raw: bytes | None, kept: Callable[[], None], refused: Callable[[], None] | None = None) -> None:
        """`kept` once the interaction `raw` is in the session store (at once without a shared
        one), after the writes before it (`raw` None: nothing to write); `refused` (default
        `kept`) when the store cannot take it: an event is stored before its ack leaves, so a
        replica continuing the session knows it."""

    @property
    def paced(self) -> bool:
        """The model paces the session to its playhead: acks carry `received_at`."""


class Steering:
    """The messages of one session's steering participants, after its session.start."""

    def __init__(
        self,
        session: SteeredSession,
        life: SessionPhase,
        settings: ProxySettings,
        upstream: Upstream,
        acks: ProxyAcks,
        dispatch: Dispatch,
        playhead: PlayheadTiming,
        metrics: ProxyMetrics,
        *,
        invites: Invitations,
        continuity: Continuity,
        trace: SessionTrace = NO_TRACE,
    ) -> None:
        self._session = session
        self._invites = invites  # the hubs a new event is shared with, the broadcast, the recording
        self._continuity = continuity  # the tokens the store binds (a revoked steer token goes)
        self._trace = trace  # the session's trace (rtvideo.proxy.observability.tracing): received, forwarded
        self._life = life
        self._settings = settings
        self._upstream = upstream
        self._acks = acks
        self._dispatch = dispatch
        self._playhead = playhead
        self._metrics = metrics
        self._share = in_flight_share(settings)

    def frame(self, steerer: Steerer, raw: str | bytes, binary: bool) -> Awaitable[None] | None:
        """A frame from `steerer`: early checks, then forwarded verbatim (or answered here).
        Returns an awaitable when the frame was over the rate: Tornado reads the next frame
        only once it is done, so a flood meets TCP backpressure and costs the proxy little."""
        guest = steerer.guest
        # A guest may steer a detached session (its owner is away, the generator paused).
        if not (self._life.attached or (guest is not None and self._life.phase is Phase.DETACHED)):
            return None  # the end is claimed: frames still buffered behind it are ignored
        if not steerer.within_rate(time.monotonic()) and (guest is not None or not over_rate_stop(raw, binary)):
            if guest is not None:
                self._metrics.steer_messages.inc()
            self._dispatch.reject(
                ErrorCode.RATE_LIMITED,
                f"over the rate of {self._settings.max_messages_per_second:g} "
                f"messages a second (burst {self._settings.message_burst}); this one was not processed",
                event_id=refused_event_id(raw, binary),
                to=guest,
            )
            return _after(OVER_RATE_READ_PAUSE_SECONDS)
        self._route(raw, binary, guest)
        return None

    def _route(self, raw: str | bytes, binary: bool, guest: Guest | None) -> None:
        try:
            message = protocol.decode_later(raw, binary=binary)
        except ProtocolError as exc:
            if guest is not None:
                self._metrics.steer_messages.inc()
            self._dispatch.reject(exc.code, exc.message, to=guest)
            return
        self._invites.heard(message, guest)  # every message parsed, with its sender: for the recording
        kind = message["type"]
        if guest is not None and kind != protocol.PLAYBACK:  # a report steers nothing: not counted
            self._metrics.steer_messages.inc()
        if guest is not None and kind in (protocol.STOP, protocol.REVOKE_STEERING, protocol.BROADCAST):
            self._dispatch.reject(ErrorCode.INVALID_MESSAGE, f"only the session's owner may send {kind}", to=guest)
        elif kind == protocol.BROADCAST:
            self._broadcast(message)
        elif kind == protocol.REVOKE_STEERING:
            revoked, life = self._revoke(), self._life
            self._dispatch.answer(lambda: server_messages.steering_revoked(life.request_id, revoked))
        elif kind == protocol.STOP:
            self._session.stop()  # a repeated stop is harmless
        elif kind == protocol.PING:
            self._dispatch.answer(server_messages.pong, to=guest)
            self._upstream.forward_ping()
        elif kind == protocol.PLAYBACK:
            self._playback(message, raw_bytes(raw), guest)
        elif self._life.phase is Phase.STOP_SENT:  # the sequence is closed
            self._dispatch.reject(ErrorCode.INVALID_MESSAGE, "session.stop was sent; the session is ending", to=guest)
        elif self._upstream.in_flight >= self._settings.max_requests_in_flight or (
            guest is not None and guest.in_flight(self._upstream.awaiting) >= self._share
        ):
            bound = self._settings.max_requests_in_flight if guest is None else self._share
            self._dispatch.reject(
                ErrorCode.RATE_LIMITED,
                f"too many requests in flight (at most {bound}); this one was not processed",
                event_id=event_id_in(message),
                to=guest,
            )
        elif kind == protocol.INTERACTION:
            self._interact(message, raw_bytes(raw), guest)
        else:
            tag = self._upstream.send(raw_bytes(raw))
            if guest is not None:
                guest.forwarded(tag)
                self._dispatch.route(tag, guest)

    def _broadcast(self, message: Mapping[str, Any]) -> None:
        """The owner's `session.broadcast`: `{"enabled": false}` ends the broadcast (its playlist
        gets EXT-X-ENDLIST), the session goes on; answered `session.broadcast_ended` (again for a
        repeat). A broadcast is begun only by the start (`"broadcast": true`)."""
        try:
            protocol.validate_broadcast(message)
        except ProtocolError as exc:
            self._dispatch.reject(exc.code, exc.message)
            return
        ended, life = self._invites.end_broadcast(), self._life
        if ended is None:
            self._dispatch.reject(
                ErrorCode.INVALID_MESSAGE, 'the session has no broadcast (start with "broadcast": true)'
            )
            return

        def answer(done: asyncio.Future[str]) -> None:  # once the ended playlist is on the store
            if life.attached and not done.cancelled():
                url = done.result()
                self._dispatch.answer(lambda: server_messages.broadcast_ended(life.request_id, url))

        ended.add_done_callback(answer)

    def _interact(self, message: Mapping[str, Any], raw: bytes, guest: Guest | None = None) -> None:
        """Acked here when the proxy can decide it like the model (rtvideo.proxy.session.acks);
        forwarded in order, but for a retry of an event acked here: the model has its first copy
        (or, after a move, knows it as named or got it again), and would apply nothing, so a
        superseded or failed event retried after a move is never applied by the new model.

        With a shared store a new event is written there first (docs/decisions.md "The session
        store under faults"): only then is it forwarded, told to the others and acked, so no ack
        leaves before a takeover could read the event, and no chunk ever waits for an ack on the
        store. One the store cannot take is refused with `store_unavailable` (retryable), as if
        never admitted. Every interaction waits for the writes before it, so they reach the model
        in the order they came."""
        received = time.perf_counter()
        ack = self._acks.decide(message, raw)
        if ack is None:  # the model answers it: forwarded after the interactions before it
            self._session.when_kept(None, lambda: self._unacked(raw, message, received, guest))
            return
        self._trace.interaction(ack.event_id, received)
        self._session.when_kept(
            ack.raw if ack.new else None,  # a retry is stored already
            lambda: self._kept(message, ack, received, guest),
            lambda: self._unkept(ack, guest),
        )

    def _unacked(self, raw: bytes, message: Mapping[str, Any], received: float, guest: Guest | None) -> None:
        if not self._open_to(guest):
            return
        tag = self._upstream.send(raw)
        self._dispatch.ack_due(tag, received, guest)
        if guest is not None:
            guest.forwarded(tag)
        self._trace.interaction(event_id_in(message), received)

    def _kept(self, message: Mapping[str, Any], ack: Ack, received: float, guest: Guest | None) -> None:
        """The acked interaction is in the store (or there is none): forwarded, shared, acked."""
        if not self._open_to(guest):
            return
        event_id, life = ack.event_id, self._life
        if ack.new:
            tag = self._upstream.send(ack.raw)
            self._acks.forwarded(tag, ack)
            if guest is not None:
                guest.forwarded(tag)  # its model ack is dropped, but it counts in flight until it comes
            # told to the others before its sender's ack: no chunk can name it ahead of this
            sender = "owner" if guest is None else "steerer"
            self._tell_others(
                server_messages.interaction_shared(life.request_id, event_id, sender, message["interaction"]), guest
            )
        # vLLM-Omni 0.32's ingress stamp on a paced session's acks, on the wall clock
        # (`received` is this process's perf_counter)
        received_at = time.time() - (time.perf_counter() - received) if self._session.paced else None
        self._dispatch.answer(
            lambda: server_messages.queued(life.request_id, event_id, received_at),
            ack=event_id,
            received=received,
            to=guest,
        )

    def _unkept(self, ack: Ack, guest: Guest | None) -> None:
        """The store could not take the interaction: never acked, never forwarded, forgotten."""
        if ack.new:
            self._acks.unkept(ack)
        self._metrics.store_refusals.inc()
        self._dispatch.reject(
            ErrorCode.STORE_UNAVAILABLE,
            "the session store cannot keep this interaction now; it was not applied: send it again shortly",
            event_id=ack.event_id,
            to=guest,
        )

    def _tell_others(self, notice: Mapping[str, Any], sender: Guest | None) -> None:
        """`session.interaction.shared` to everyone but its sender (docs/protocol.md §9.4): the
        owner in the session's order (it never precedes video.start), steerers and watchers ahead
        of their queued video."""
        if sender is not None:
            self._dispatch.answer(lambda: notice)
        hubs = (self._invites.steer_hub, self._invites.hub)
        if any(hub is not None and len(hub) for hub in hubs):
            frame = Frame(server_messages.encode(notice), notice)
            for hub in hubs:
                if hub is not None:
                    hub.share(frame, sender)

    def _revoke(self) -> int:
        """The owner's session.revoke_steering: every guest's steer link ends, and the steer token
        is never adopted again (the store forgets it). Returns how many links there were."""
        revoked = self._invites.revoke_steering()
        self._continuity.tokens(self._invites.token_hashes(), gone=("steer",))
        return revoked

    def _open_to(self, guest: Guest | None) -> bool:
        """Whether an interaction whose store write was awaited may still go on (the session is
        live, its sequence open to it); one that came too late is answered as if it came now."""
        if not self._life.live:
            return False
        if self._life.phase is Phase.STOP_SENT:
            self._dispatch.reject(ErrorCode.INVALID_MESSAGE, "session.stop was sent; the session is ending", to=guest)
            return False
        return True

    def _playback(self, message: Mapping[str, Any], raw: bytes, guest: Guest | None = None) -> None:
        """A playhead report (docs/protocol.md §2.6): checked here, fed to the on-screen timing,
        and forwarded while the sequence is open. The model completes it flags-only and answers
        nothing, so it is not counted in flight (the rate bounds it); a malformed one is the
        only report answered, with `invalid_message`. A guest's is checked, then dropped: only the
        owner's playhead paces the stream."""
        try:
            report = protocol.validate_playback(message)
        except ProtocolError as exc:
            self._dispatch.reject(exc.code, exc.message, to=guest)
            return
        if guest is not None:
            return
        self._playhead.report(report.position_seconds, report.buffered_seconds)
        self._upstream.send_report(raw)


def _after(delay: float) -> asyncio.Future[None]:
    """A future that is done in `delay` seconds (never cancelled: Tornado would abort the
    connection on a cancelled one)."""
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def done() -> None:
        if not future.done():
            future.set_result(None)

    asyncio.get_running_loop().call_later(delay, done)
    return future


def raw_bytes(raw: str | bytes) -> bytes:
    return raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
