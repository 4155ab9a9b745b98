"""One WebSocket session translated onto one Triton sequence (docs/protocol.md §2–3, §7–8).

The proxy checks only what it must answer itself (first message, size, JSON, type,
binary frames) and forwards every other message verbatim; the model validates the
rest. A valid interaction it acks at once, as the model would (rtvideo.proxy.acks). It
bounds what one client can make it and Triton hold (§7): a token bucket for the message
rate, a bound on requests in flight to Triton, and `session.ping` answered here (at most
one a second goes on, to keep the model's stall clock running). A live session's sequence
that had nothing forwarded for `KEEPALIVE_SECONDS` gets a keep-alive of the proxy's own, so
Triton's idle timeout never ends it (§8); its pong is dropped. The session's events are
in one `EventBook`, kept by its `Ledger` (rtvideo.proxy.ledger): every `session.done` the
client gets has that book's lists.

Each session ends exactly once: the model's `session.done`, or an end the proxy
reports itself (`start_timeout`, `invalid_start`, `slow_consumer`, `backend_unavailable`,
`server_shutdown`),
or the client going away. In every case the Triton sequence is ended before the
stream is dropped, so its slot is freed: `session.stop` with `sequence_end`, then the
request stream is half-closed, and Triton ends the call once every request completed.

A resumable session (`"resumable": true`) whose connection drops is detached instead: its
sequence stays open, the model pauses it, and a `session.resume` on a new connection takes it
over with nothing lost (rtvideo.proxy.resume, rtvideo.proxy.replay); a watchable one fans its
pairs out to read-only watchers (rtvideo.proxy.watchers).

Where a session is lives in one `Phase`; what may be written when is decided by its
`OutboundOrder` (rtvideo.proxy.ordering), which the session feeds and obeys.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from rtvideo.core import protocol
from rtvideo.core.chunks import init_metadata
from rtvideo.core.errors import ErrorCode, ProtocolError
from rtvideo.proxy.acks import Answer, ProxyAcks
from rtvideo.proxy.bridge import END_GRACE_SECONDS, KEEPALIVE, PING, STOP, BackendUnavailable
from rtvideo.proxy.ledger import Ledger
from rtvideo.proxy.limits import TokenBucket, event_id_in, over_rate_stop, refused_event_id
from rtvideo.proxy.metrics import ProxyMetrics
from rtvideo.proxy.ordering import OutboundOrder, Send
from rtvideo.proxy.outbox import Frame, Outbox, Sink
from rtvideo.proxy.replay import ReplayBuffer, ReplayGap, init_segment
from rtvideo.proxy.resume import PAUSE, UNPAUSE, Features, Parked, ResumeRefused, take_options
from rtvideo.proxy.settings import ProxySettings
from rtvideo.proxy.streams import SessionStream, StreamSource
from rtvideo.proxy.tasks import TaskSet, cancel_and_wait
from rtvideo.proxy.watchers import WatchHub
from rtvideo.triton.access import short_hash
from rtvideo.triton.wire import START_TAG, Reply

log = logging.getLogger(__name__)

#: how long a chunk may wait for the ack of an event it names (the ack is already on its way)
ACK_WAIT_SECONDS = 1.0
#: at most one client session.ping a second goes on to Triton (it resets the model's stall clock)
PING_FORWARD_SECONDS = 1.0
#: a live session's sequence that had no request forwarded for this long gets a keep-alive
#: (`KEEPALIVE`), so Triton's idle timeout (120 s, docs/protocol.md §8) never ends it
KEEPALIVE_SECONDS = 30.0
#: after a frame over the rate, the client's next frame is read this much later: a flooding client
#: costs the proxy at most about 1,000 answered frames a second and meets TCP backpressure
#: beyond, while what it has already pushed into its socket is still drained and answered
OVER_RATE_READ_PAUSE_SECONDS = 0.001
#: how long the last messages of a session may take to reach a client before the close
FLUSH_SECONDS = 10.0


class Connection(Sink, Protocol):
    """The WebSocket (Tornado's handler): writes and a close."""

    def close(self, code: int | None = None, reason: str | None = None) -> None: ...

    async def responsive(self, timeout: float) -> bool:
        """Whether the peer answers a WebSocket ping within `timeout` seconds."""
        ...

    def abandon(self) -> None:
        """Close the TCP connection without a close frame (the peer is gone: nothing to say)."""
        ...


class Phase(enum.Enum):
    """Where a session is. Moves forward only: AWAITING_START → STREAMING → STOP_SENT, then
    one end (REFUSED before a session.start was forwarded, ENDING after), then CLOSED. The one
    way back: a resumable session's STREAMING → DETACHED → STREAMING (a resume, rtvideo.proxy.resume)."""

    AWAITING_START = enum.auto()  # connected; the first message decides
    STREAMING = enum.auto()  # the sequence is open: client messages go to Triton
    STOP_SENT = enum.auto()  # sequence_end went to Triton: pings are answered, model replies still go out
    REFUSED = enum.auto()  # the first message was refused or never came: error, done, close; no sequence
    ENDING = enum.auto()  # the end is claimed: nothing more forwarded or accepted; end sequence, flush, close
    # the connection dropped; the session waits for a session.resume (rtvideo.proxy.resume), its
    # generator paused; back to STREAMING on a resume, ENDING/CLOSED when the grace is over
    DETACHED = enum.auto()
    CLOSED = enum.auto()  # the WebSocket is closed


#: phases in which replies (Triton's and the proxy's own) still go to the client
_LIVE = frozenset({Phase.AWAITING_START, Phase.STREAMING, Phase.STOP_SENT, Phase.DETACHED})


@dataclass(frozen=True)
class _OwnAnswer:
    """An answer the proxy writes itself (pong, ack, error about one message). Built when it is
    written, so that an answer held behind video.start names the request."""

    build: Callable[[], Mapping[str, Any]]
    received: float | None = None  # an ack's: when the client's frame arrived (perf_counter)


_Item = Reply | _OwnAnswer


class ProxySession:
    """The state of one connection; every method runs on the proxy's event loop."""

    def __init__(
        self,
        conn: Connection,
        bridge: StreamSource,
        settings: ProxySettings,
        metrics: ProxyMetrics,
        peer: str,
        on_closed: Callable[[ProxySession], None],
        features: Features | None = None,
    ) -> None:
        self._conn = conn
        self._bridge = bridge
        self._settings = settings
        self._metrics = metrics
        self.peer = peer
        self._on_closed = on_closed
        self.ledger = Ledger()  # what the client was handed; holds the session's EventBook
        self._acks = ProxyAcks(self.ledger.book)
        self.request_id: str | None = None  # from video.start, once forwarded
        self._phase = Phase.AWAITING_START
        self._outbox: Outbox | Parked = Outbox(conn, settings.outbound_buffer_bytes, metrics, self._taken)
        self._order: OutboundOrder[_Item] = OutboundOrder(ack_wait=ACK_WAIT_SECONDS)
        self._ack_timer: asyncio.TimerHandle | None = None
        self._stream: SessionStream | None = None  # the Triton sequence, while there is one to end
        self._stop_tag: str | None = None  # the request that carried sequence_end
        self._stream_over = asyncio.Event()  # Triton ended the call (or it broke, or was cancelled)
        self._closed = asyncio.Event()  # the WebSocket is closed (awaited by shutdown)
        self._interactions: dict[str, float] = {}  # request tag → when the client's frame arrived
        self._in_flight: set[str] = set()  # tags of requests sent to Triton whose one answer is due
        self._ping_tag: str | None = None  # the forwarded session.ping in flight (its pong is dropped)
        self._ping_forwarded = float("-inf")  # when the last one went
        self._forwarded = time.monotonic()  # when a request last went to Triton on the sequence
        self._keepalive_tags: set[str] = set()  # keep-alives sent (their pongs are dropped)
        self._keepalive_timer: asyncio.TimerHandle | None = None
        self._bucket = TokenBucket(settings.max_messages_per_second, settings.message_burst, time.monotonic())
        self._heard = time.monotonic()  # when Triton last sent anything on this session's stream
        self._silence_timer: asyncio.TimerHandle | None = None
        self._tasks = TaskSet()
        self._opened = time.monotonic()
        self._timing = metrics.stream_timing()  # time to first chunk, chunk lead
        self._playhead = metrics.playhead_timing()  # on-screen latency and lead, from playhead reports
        self._start_timer = asyncio.get_running_loop().call_later(settings.start_timeout, self._start_timed_out)
        metrics.session_opened()
        self._init_resume(features)

    # --- phase transitions -----------------------------------------------------------------
    def _open_sequence(self, stream: SessionStream) -> None:
        """AWAITING_START → STREAMING: session.start went to Triton on its own stream."""
        self._stream, self._phase = stream, Phase.STREAMING
        self._heard = self._forwarded = time.monotonic()
        self._watch_silence()
        self._keep_alive()

    def _stop_sent(self, tag: str) -> None:
        """STREAMING → STOP_SENT: the client's session.stop carried sequence_end."""
        self._stop_tag, self._phase = tag, Phase.STOP_SENT

    def _claim_end(self) -> bool:
        """A live session → REFUSED or ENDING, at once, so nothing else is forwarded or accepted,
        not even later in the current synchronous burst. False if the end was already claimed."""
        if self._phase not in _LIVE:
            return False
        self._phase = Phase.REFUSED if self._phase is Phase.AWAITING_START else Phase.ENDING
        return True

    @property
    def awaiting_start(self) -> bool:
        """Connected, and no session.start accepted yet: what the waiting share counts."""
        return self._phase is Phase.AWAITING_START

    @property
    def waited(self) -> float:
        """Seconds since the connection was opened."""
        return time.monotonic() - self._opened

    def displace(self) -> None:
        """Still waiting for its session.start while the waiting share is full and another client
        connects: it ends as if its start timeout were over (`start_timeout`, done, close)."""
        if self._phase is Phase.AWAITING_START:
            self._start_timer.cancel()
            self._fail(
                ErrorCode.START_TIMEOUT,
                f"no session.start after {self.waited:.1f} s while other clients wait to connect",
            )

    def _mark_closed(self) -> Phase:
        """Any phase → CLOSED; returns the phase it left."""
        left, self._phase = self._phase, Phase.CLOSED
        self._closed.set()
        return left

    # --- client → Triton -------------------------------------------------------------------
    def on_frame(self, raw: str | bytes, binary: bool) -> Awaitable[None] | None:
        """A frame from the client: early checks, then forwarded verbatim (or answered here).
        Returns an awaitable when the frame was over the rate: Tornado reads the next frame
        only once it is done, so a flood meets TCP backpressure and costs the proxy little."""
        if self._phase is Phase.AWAITING_START:
            self._on_first(raw, binary)
            return None
        if self._phase not in (Phase.STREAMING, Phase.STOP_SENT):
            return None  # the end is claimed: frames still buffered behind it are ignored
        if not self._bucket.take(time.monotonic()) and not over_rate_stop(raw, binary):
            self._reject(
                ErrorCode.RATE_LIMITED,
                f"over the rate of {self._settings.max_messages_per_second:g} "
                f"messages a second (burst {self._settings.message_burst}); this one was not processed",
                event_id=refused_event_id(raw, binary),
            )
            return _after(OVER_RATE_READ_PAUSE_SECONDS)
        self._on_later(raw, binary)
        return None

    def _on_later(self, raw: str | bytes, binary: bool) -> None:
        try:
            message = protocol.decode_later(raw, binary=binary)
        except ProtocolError as exc:
            self._reject(exc.code, exc.message)
            return
        kind = message["type"]
        if kind == protocol.STOP:
            self._send_stop()  # once; a repeated stop is harmless
        elif kind == protocol.PING:
            self._answer(protocol.pong)
            self._forward_ping()
        elif kind == protocol.PLAYBACK:
            self._playback(message, _raw_bytes(raw))
        elif self._phase is Phase.STOP_SENT:  # the sequence is closed
            self._reject(ErrorCode.INVALID_MESSAGE, "session.stop was sent; the session is ending")
        elif len(self._in_flight) >= self._settings.max_requests_in_flight:
            self._reject(
                ErrorCode.RATE_LIMITED,
                f"too many requests in flight (at most "
                f"{self._settings.max_requests_in_flight}); this one was not processed",
                event_id=event_id_in(message),
            )
        elif kind == protocol.INTERACTION:
            self._interact(message, _raw_bytes(raw))
        else:
            self._send(_raw_bytes(raw))

    def _interact(self, message: Mapping[str, Any], raw: bytes) -> None:
        """Acked here at once when the proxy can decide it like the model (rtvideo.proxy.acks);
        forwarded either way, in order."""
        received = time.perf_counter()
        ack = self._acks.decide(message, raw)
        if ack is None:
            self._interactions[self._send(raw)] = received
            return
        self._acks.forwarded(self._send(ack.raw), ack)
        event_id = ack.event_id
        self._answer(lambda: protocol.queued(self.request_id, event_id), ack=event_id, received=received)

    def _send(self, raw: bytes) -> str:
        """One later request to Triton; it counts as in flight until its one answer arrives."""
        assert self._stream is not None  # STREAMING
        tag = self._stream.send(raw)
        self._in_flight.add(tag)
        self._forwarded = time.monotonic()
        return tag

    def _playback(self, message: Mapping[str, Any], raw: bytes) -> None:
        """A playhead report (docs/protocol.md §2.6): checked here, fed to the on-screen timing,
        and forwarded while the sequence is open. The model completes it flags-only and answers
        nothing, so it is not counted in flight (the rate bounds it); a malformed one is the
        only report answered, with `invalid_message`."""
        try:
            report = protocol.validate_playback(message)
        except ProtocolError as exc:
            self._reject(exc.code, exc.message)
            return
        self._playhead.report(report.position_seconds, report.buffered_seconds)
        if self._phase is Phase.STREAMING and self._stream is not None:
            self._stream.send(raw)
            self._forwarded = time.monotonic()

    def _keep_alive(self) -> None:
        """One timer while the sequence is open: when nothing went to Triton on it for
        `KEEPALIVE_SECONDS`, a keep-alive does (docs/protocol.md §8). It is no client message: no
        rate or in-flight bound counts it, its pong is dropped, and the model does not take it
        for progress (the stall clock, §7)."""
        self._keepalive_timer = None
        stream = self._stream
        if stream is None or self._phase not in (Phase.STREAMING, Phase.DETACHED):
            return
        quiet = time.monotonic() - self._forwarded
        if quiet >= KEEPALIVE_SECONDS:
            self._keepalive_tags.add(stream.send(KEEPALIVE))
            self._forwarded, quiet = time.monotonic(), 0.0
        self._keepalive_timer = asyncio.get_running_loop().call_later(KEEPALIVE_SECONDS - quiet, self._keep_alive)

    def _send_stop(self) -> None:
        """STREAMING: the client's (or the shutdown's) session.stop goes with sequence_end. It
        completes flags-only, so it is never counted in flight."""
        if self._phase is Phase.STREAMING:
            assert self._stream is not None
            self._stop_sent(self._stream.send(STOP, end=True))

    def _forward_ping(self) -> None:
        """Pings are answered here; one a second at most, and one at a time, goes to Triton to
        reset the model's stall clock (docs/protocol.md §7). The model's pong is dropped."""
        now = time.monotonic()
        if (
            self._phase is Phase.STREAMING
            and self._ping_tag is None
            and now - self._ping_forwarded >= PING_FORWARD_SECONDS
            and len(self._in_flight) < self._settings.max_requests_in_flight
        ):
            self._ping_tag, self._ping_forwarded = self._send(PING), now

    def _on_first(self, raw: str | bytes, binary: bool) -> None:
        self._start_timer.cancel()
        try:
            first = protocol.check_first_message(raw, binary=binary)
            raw = self._take_start_options(first, _raw_bytes(raw))
        except ProtocolError as exc:
            self._fail(exc.code, exc.message)
            return
        stream = self._bridge.open_stream()
        self._timing.started()
        stream.send(_raw_bytes(raw), start=True)
        self._open_sequence(stream)
        self._spawn(self._pump(stream))

    def _start_timed_out(self) -> None:
        if self._phase is Phase.AWAITING_START:
            self._fail(ErrorCode.START_TIMEOUT, f"no session.start within {self._settings.start_timeout:g} s")

    # --- Triton → client -------------------------------------------------------------------
    async def _pump(self, stream: SessionStream) -> None:
        try:
            async for reply in stream.replies():
                self._on_reply(reply)
            if self._phase in _LIVE and self._stream is stream and not self._done_parked:
                raise BackendUnavailable("Triton ended the stream before session.done")
        except BackendUnavailable as exc:
            self._stream_broke(stream, str(exc))
        finally:
            self._stream_over.set()

    def _stream_broke(self, stream: SessionStream, reason: str) -> None:
        """The stream failed (or fell silent): nothing is left to end on Triton's side; a live
        session ends with backend_unavailable and a session.done written here."""
        if self._stream is stream:
            self._stream = None
        stream.cancel()
        if self._phase in _LIVE:
            log.warning("request_id=%s peer=%s backend failure: %s", self.request_id, self.peer, reason)
            self._fail(ErrorCode.BACKEND_UNAVAILABLE, "the video backend is unavailable; try again later")

    def _watch_silence(self) -> None:
        """One timer while the stream is live; when it fires early (Triton spoke since it was
        armed) it re-arms for the rest, so a reply costs only a clock read."""
        self._silence_timer = None
        stream = self._stream
        if stream is None or self._phase not in _LIVE:
            return
        limit = self._settings.backend_silence_seconds
        quiet = time.monotonic() - self._heard
        if quiet < limit:
            self._silence_timer = asyncio.get_running_loop().call_later(limit - quiet, self._watch_silence)
        else:
            self._stream_broke(stream, f"Triton sent nothing for {limit:g} s")

    def _on_reply(self, reply: Reply) -> None:
        self._heard = time.monotonic()
        self._in_flight.discard(reply.tag)
        message = reply.message
        if message is None:
            return  # flags-only: nothing for the client (the streams yield none)
        if reply.tag == self._ping_tag:
            self._ping_tag = None
            return  # the client had its pong from the proxy
        if reply.tag in self._keepalive_tags:
            self._keepalive_tags.discard(reply.tag)
            return  # the proxy's own keep-alive: nothing for the client
        answer = self._acks.answered(reply.tag, message)
        if answer is Answer.REFUSED:
            self._metrics.ack_refused()
            log.info(
                "request_id=%s an interaction acked by the proxy was refused by the model (%s); "
                "session.done lists it as unapplied",
                self.request_id,
                reply.text[:200],
            )
        if answer is not Answer.NOT_ACKED_HERE:
            return  # the client had its ack from the proxy
        if reply.tag == self._stop_tag or self._phase not in _LIVE:
            return  # the answer to session.stop is the trailer and session.done, not this
        kind = message.get("type")
        if reply.tag == START_TAG:
            self._deliver(self._order.stream(reply, message, time.monotonic()))
        else:  # the answer to one later request (ack, pong, per-message error)
            ack = message["event_id"] if kind == protocol.QUEUED else None
            self._deliver(self._order.answer(reply, len(reply.text) + len(reply.data), ack))

    def _reject(self, code: ErrorCode, text: str, event_id: str | None = None) -> None:
        """An error about one client message (`event_id`: the event it names); the session goes on."""
        self._answer(lambda: protocol.error(code, text, request_id=self.request_id, event_id=event_id))

    def _answer(
        self, build: Callable[[], Mapping[str, Any]], *, ack: str | None = None, received: float | None = None
    ) -> None:
        """An answer of the proxy's own: ordered and bounded like any reply; `ack`: the event id
        it acknowledges."""
        self._deliver(self._order.answer(_OwnAnswer(build, received), len(protocol.encode(build())), ack))

    def _deliver(self, sends: list[Send[_Item]]) -> None:
        """Write what the ordering released, in order, until the end is claimed (a refused
        write, session.done); answers held for video.start count against the outbound bound."""
        if self._order.early_bytes > self._settings.outbound_buffer_bytes:
            self._slow_consumer()
        for send in sends:
            if self._phase not in _LIVE:
                return
            if isinstance(send.item, Reply):
                self._forward(send.item, send.urgent)
            elif not self._emit(message := send.item.build(), urgent=send.urgent):
                self._slow_consumer()
            elif send.item.received is not None:
                self._acked(message, send.item.received)
        if self._phase in _LIVE:
            self._arm_ack_timer()

    def _forward(self, reply: Reply, urgent: bool) -> None:
        message = reply.message
        assert message is not None  # `_on_reply` passes on only replies that carry one
        kind = message.get("type")
        received = self._interactions.pop(reply.tag, None)
        text = reply.text
        if kind == protocol.VIDEO_START:
            self.request_id = message.get("request_id")
            log.info("request_id=%s peer=%s session started", self.request_id, self.peer)
            message, text = self._offer_features(message, text)
        data = reply.data if kind == protocol.CHUNK_METADATA else None
        if not self._emit(message, text=text, data=data, urgent=urgent):
            self._slow_consumer()
        elif kind == protocol.DONE and self._phase is Phase.DETACHED:
            self._done_parked = True  # the end waits for a resume (attach) or the grace (on_disconnect)
        elif kind == protocol.DONE and self._claim_end():
            self._spawn(self._finish(FLUSH_SECONDS))
        if kind == protocol.QUEUED and received is not None:
            self._acked(message, received)

    def _acked(self, message: Mapping[str, Any], received: float) -> None:
        self._metrics.observe_ack(time.perf_counter() - received)
        self._playhead.sent(message["event_id"], received)
        log.debug("request_id=%s event_id=%s queued", self.request_id, message["event_id"])

    def _emit(
        self,
        message: Mapping[str, Any],
        *,
        text: str | None = None,
        data: bytes | None = None,
        urgent: bool = False,
        force: bool = False,
        now: bool = False,
    ) -> bool:
        if message.get("type") == protocol.ERROR:
            self._metrics.error_sent(str(message.get("code")))
        frame = Frame(text if text is not None else protocol.encode(message), message, data)
        if now:
            self._outbox.write_now(frame)
            return True
        return self._outbox.put(frame, urgent=urgent, force=force)

    def _slow_consumer(self) -> None:
        self._fail(
            ErrorCode.SLOW_CONSUMER,
            f"the client reads too slowly: more than {self._settings.outbound_buffer_bytes} bytes are waiting",
        )

    def _taken(self, frame: Frame) -> Frame:
        """A frame handed to the socket; returns what is written (a done with the book's lists)."""
        if frame.replay:
            return frame  # sent again after a resume: the ledger and the timing saw it the first time
        frame = self.ledger.taken(frame)
        self._timing.taken(frame.message)
        self._playhead.taken(frame.message)
        self._order.handed_out(frame.message)
        self._after_taken(frame)
        return frame

    def _arm_ack_timer(self) -> None:
        """One timer, for the ordering's deadline. The deadline only moves later while it is armed,
        so firing early at worst finds nothing due and re-arms."""
        deadline = self._order.deadline
        if deadline is not None and self._ack_timer is None:
            delay = max(0.0, deadline - time.monotonic())
            self._ack_timer = asyncio.get_running_loop().call_later(delay, self._ack_wait_over)

    def _ack_wait_over(self) -> None:
        self._ack_timer = None
        released = self._order.expire(time.monotonic())
        if released:
            log.warning(
                "request_id=%s released %d message(s) whose ack did not arrive in %.1f s",
                self.request_id,
                len(released),
                self._order.ack_wait,
            )
        self._deliver(released)

    # --- ending ----------------------------------------------------------------------------
    def _fail(self, code: ErrorCode, message: str, close_code: int = 1000) -> None:
        """End the session from the proxy's side: claimed at once, reported by a task."""
        if self._claim_end():
            self._spawn(self._report_failure(code, message, close_code))

    def on_invalid_text(self) -> None:
        """A text frame that is not UTF-8 breaks the WebSocket contract (RFC 6455 §8.1): the
        error and a complete `session.done` while the socket still takes them, then close 1007."""
        self._start_timer.cancel()
        code = ErrorCode.INVALID_START if self._phase is Phase.AWAITING_START else ErrorCode.INVALID_JSON
        self._fail(code, "a text frame was not valid UTF-8; closing (1007)", close_code=1007)

    async def _report_failure(self, code: ErrorCode, message: str, close_code: int = 1000) -> None:
        """Error, `session.done` (from the ledger: what the client was actually handed), close."""
        stuck = code is ErrorCode.SLOW_CONSUMER or not await self._outbox.flush(1.0)
        if stuck:
            self._outbox.discard()  # the client cannot take more; the end must still fit
        # Nothing is queued now but the error: the ledger has seen every frame before the done.
        # A stuck writer would never reach them: they go to the socket directly, before the close.
        self._emit(protocol.error(code, message, request_id=self.request_id), force=True, now=stuck)
        self._emit(self.ledger.done(), force=True, now=stuck)
        await self._finish(1.0 if code is ErrorCode.SLOW_CONSUMER else FLUSH_SECONDS, close_code)

    async def _finish(self, flush_seconds: float, close_code: int = 1000) -> None:
        """After the session's last message: end the sequence, flush, close (normally, by default)."""
        await self._end_sequence()
        await self._outbox.flush(flush_seconds)
        self._conn.close(close_code)
        if self._conn_gone:  # ended while detached: no connection will report its close
            self.on_disconnect()

    async def _end_sequence(self) -> None:
        """End the sequence and the call: `sequence_end` (unless the client's stop carried it),
        then half-close the request stream; Triton ends the call once every request has
        completed. The stop's own answer is flags-only and never reaches an aio client, so the
        end of the call is what is awaited (bounded), then the stream is dropped."""
        stream = self._stream
        if stream is None:
            return  # never opened, or broken
        self._stream = None
        if self._stop_tag is None:
            self._stop_tag = stream.send(STOP, end=True)
        stream.close_requests()
        try:
            await asyncio.wait_for(self._stream_over.wait(), END_GRACE_SECONDS)
        except asyncio.TimeoutError:
            log.warning(
                "request_id=%s sequence=%s Triton did not end the call within %g s; cancelling",
                self.request_id,
                short_hash(stream.sequence_id),
                END_GRACE_SECONDS,
            )
        stream.cancel()

    def on_disconnect(self, *, dropped: bool = False) -> None:
        """The WebSocket is closed (by either side): free everything, exactly once. `dropped`:
        it went without a close frame or with a code other than 1000; a resumable session is
        then detached instead (rtvideo.proxy.resume)."""
        if dropped and self._may_detach():
            self._detach()
            return
        left = self._mark_closed()
        if left is Phase.CLOSED:
            return
        self._start_timer.cancel()
        for timer in (self._ack_timer, self._silence_timer, self._keepalive_timer):
            if timer is not None:
                timer.cancel()
        self._outbox.close()
        if left in _LIVE:  # no end was claimed: the sequence is still open
            self._spawn(self._end_sequence())
        self._metrics.session_closed()
        self._resume_closed()
        log.info(
            "request_id=%s peer=%s session ended chunks=%d after %.1f s",
            self.request_id,
            self.peer,
            self.ledger.chunks,
            time.monotonic() - self._opened,
        )
        self._on_closed(self)

    async def shutdown(self, timeout: float) -> None:
        """Server shutdown (after the drain): `server_shutdown`, a complete `session.done` and close
        1001; the sequence is ended on Triton as for any end. An end already under way goes on."""
        self._start_timer.cancel()
        self._fail(ErrorCode.SERVER_SHUTDOWN, "the server is shutting down; reconnect to go on", close_code=1001)
        try:
            await asyncio.wait_for(self._closed.wait(), timeout)
        except asyncio.TimeoutError:
            self._conn.close(1001, "server shutting down")
        # The session's tasks end by themselves (every wait in them is bounded), but a stream
        # Triton never ends must not hold the server's stop: what is left after `timeout` goes.
        pending = await self._tasks.wait(timeout)
        for task in pending:
            log.warning("request_id=%s a task did not end at shutdown: %s", self.request_id, task.get_coro())
        await cancel_and_wait(pending)

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        self._tasks.spawn(coro)

    # --- resume and watchers (rtvideo.proxy.resume, rtvideo.proxy.watchers; docs/protocol.md §9) ---
    def _init_resume(self, features: Features | None) -> None:
        self._features = features
        self._options: dict[str, bool] = {}  # the start's proxy options (resumable, watchable)
        self._resume_token: str | None = None  # the live one (never logged)
        self._watch_token: str | None = None
        self._replay: ReplayBuffer | None = None  # what the client was handed, for a resume
        self._start_message: dict[str, Any] | None = None  # video.start as handed out, without tokens
        self._init_payload: bytes | None = None  # the stream's ftyp+moov, from its first payload
        self._conn_gone = False  # DETACHED, or ended while detached: no connection to report a close
        self._grace_timer: asyncio.TimerHandle | None = None
        self._detached_counted = False
        self._watch_hub: WatchHub | None = None
        self._done_parked = False  # the model's session.done arrived while detached

    @property
    def metrics(self) -> ProxyMetrics:
        return self._metrics

    @property
    def detached(self) -> bool:
        return self._phase is Phase.DETACHED

    async def drop_if_silent(self, timeout: float) -> None:
        """Before a resume is answered for this attached session: a connection that went silent
        without a reset (a network change) is not seen by TCP for minutes, and by the WebSocket
        keep-alive only after --ping-interval + --ping-timeout; one that does not answer a ping
        within `timeout` is taken for dropped now (the session detaches), so that its resume is
        taken. A connection that answers keeps the session: one controller at a time."""
        if self._phase not in (Phase.STREAMING, Phase.STOP_SENT) or self._features is None or self._conn_gone:
            return
        conn = self._conn
        if await conn.responsive(timeout) or conn is not self._conn or self._phase is Phase.DETACHED:
            return
        log.info(
            "request_id=%s peer=%s connection silent for %.1f s: taken for dropped", self.request_id, self.peer, timeout
        )
        conn.abandon()
        for _ in range(100):  # the close reaches on_disconnect through the IOLoop
            if self._phase is not Phase.STREAMING and self._phase is not Phase.STOP_SENT:
                return
            await asyncio.sleep(0.01)

    def _take_start_options(self, first: dict[str, Any], raw: bytes) -> bytes:
        """The start without the proxy's own options (the model never sees them)."""
        if self._features is None:
            return raw  # a proxy without the features: the model refuses unknown fields as ever
        self._options, raw = take_options(first, raw)
        return raw

    def _offer_features(self, message: dict[str, Any], text: str) -> tuple[dict[str, Any], str]:
        """video.start with what the start asked for: a resume token and the grace, a watch token.
        Unchanged (the model's own text) for a start that asked for neither."""
        features = self._features
        if features is None or not any(self._options.values()):
            return message, text
        out = dict(message)
        config = dict(out.get("config") or {})
        if self._options.get("resumable"):
            config["resume_grace_seconds"] = features.resume_grace
            if features.resume_grace > 0:
                self._replay = ReplayBuffer(self._settings.replay_buffer_bytes)
                self._resume_token = features.resume_tokens.issue(self)
        if self._options.get("watchable") and self._settings.max_watchers_per_session > 0:
            self._watch_hub = WatchHub(self._settings, features, self._metrics)
            self._watch_token = features.watch_tokens.issue(self)
        out["config"] = config
        self._start_message = dict(out)
        if self._resume_token is not None:
            out["resume_token"] = self._resume_token
        if self._watch_token is not None:
            out["watch_token"] = self._watch_token
        return out, protocol.encode(out)

    def _after_taken(self, frame: Frame) -> None:
        """A frame handed to the owner's socket (not a replayed one): kept for a resume, and fanned
        out to the watchers."""
        if self._replay is None and self._watch_hub is None:
            return
        if self._init_payload is None and frame.data is not None:
            self._init_payload = init_segment(frame.data)
        if self._replay is not None:
            self._replay.record(frame)
        if self._watch_hub is not None:
            self._watch_hub.publish(frame)

    def init_frame(self) -> Frame | None:
        """The init pair (docs/protocol.md §9), once the stream's first payload was handed out."""
        if self._init_payload is None or self.request_id is None:
            return None
        meta = init_metadata(self.request_id, len(self._init_payload))
        return Frame(protocol.encode(meta), meta, self._init_payload, replay=True)

    def watcher_start(self) -> dict[str, Any] | None:
        """video.start for a watcher: the owner's, marked, without the owner's tokens."""
        if self._start_message is None:
            return None
        return {**self._start_message, "watcher": True}

    @property
    def watch_hub(self) -> WatchHub | None:
        return self._watch_hub if self._phase in _LIVE else None

    def _may_detach(self) -> bool:
        features = self._features
        return (
            self._phase is Phase.STREAMING
            and self._resume_token is not None
            and features is not None
            and features.resume_grace > 0
        )

    def _pause(self, paused: bool) -> None:
        """Pause (or go on with) the model's generator: a keep-alive of the proxy's own, its pong dropped."""
        if self._stream is not None:
            self._keepalive_tags.add(self._stream.send(PAUSE if paused else UNPAUSE))
            self._forwarded = time.monotonic()

    def _detach(self) -> None:
        """STREAMING → DETACHED: the connection dropped. What it had not taken is parked, the
        generator pauses, and the grace timer runs."""
        assert self._features is not None
        unsent = self._outbox.take_unsent()
        self._outbox.close()
        self._outbox = Parked(unsent, self._settings.outbound_buffer_bytes)
        self._phase, self._conn_gone = Phase.DETACHED, True
        self._pause(True)
        grace = self._features.resume_grace
        self._grace_timer = asyncio.get_running_loop().call_later(grace, self._grace_over)
        self._metrics.session_detached(1)
        self._detached_counted = True
        log.info("request_id=%s peer=%s connection dropped: detached for %g s", self.request_id, self.peer, grace)

    def _grace_over(self) -> None:
        self._grace_timer = None
        if self._phase is Phase.DETACHED and self._features is not None:
            log.info("request_id=%s not resumed within the grace: ending", self.request_id)
            self._features.resume_tokens.retire(
                self._resume_token, f"expired: the session was not resumed within {self._features.resume_grace:g} s"
            )
            self.on_disconnect()

    def _resume_closed(self) -> None:
        """The session is over: its tokens stop working, its watchers go, its gauges drop."""
        if self._grace_timer is not None:
            self._grace_timer.cancel()
            self._grace_timer = None
        if self._detached_counted:
            self._metrics.session_detached(-1)
            self._detached_counted = False
        if self._features is not None:
            self._features.resume_tokens.retire(self._resume_token, "the session has ended")
            self._features.watch_tokens.retire(self._watch_token, "the session has ended")
        if self._watch_hub is not None:
            self._watch_hub.close()

    def attach(self, conn: Connection, last: int, token: str, peer: str) -> None:
        """DETACHED → STREAMING on the connection of a `session.resume`: video.start again (a new
        token), the init pair, every frame after the pair `last` as first sent, what was parked,
        then the live stream. ResumeRefused (nothing changes) when it cannot."""
        if self._phase in (Phase.STREAMING, Phase.STOP_SENT):
            raise ResumeRefused("the session is attached to another connection (one controller at a time)")
        if self._phase is not Phase.DETACHED or self._replay is None or self._features is None:
            raise ResumeRefused("the session has ended")
        try:
            frames = self._replay.after(last)
        except ReplayGap as exc:
            raise ResumeRefused(str(exc), exc.oldest) from None
        if self._grace_timer is not None:
            self._grace_timer.cancel()
            self._grace_timer = None
        parked = self._outbox.take_unsent()
        self._conn, self.peer, self._conn_gone = conn, peer, False
        self._outbox = Outbox(conn, self._settings.outbound_buffer_bytes, self._metrics, self._taken)
        self._phase = Phase.STREAMING
        tokens = self._features.resume_tokens
        tokens.retire(token, "this token was used already: each resume hands out a new one")
        self._resume_token = tokens.issue(self)
        assert self._start_message is not None
        start = {**self._start_message, "resumed": True, "resume_token": self._resume_token}
        if self._watch_token is not None:
            start["watch_token"] = self._watch_token
        self._outbox.put(Frame(protocol.encode(start), start, replay=True), force=True)
        init = self.init_frame()
        if init is not None:
            self._outbox.put(init, force=True)
        for frame in frames:
            self._outbox.put(Frame(frame.text, frame.message, frame.data, replay=True), force=True)
        for frame in parked:
            self._outbox.put(frame, force=True)
        if self._done_parked and self._claim_end():  # the session ended while detached: now it is told
            self._spawn(self._finish(FLUSH_SECONDS))
            return
        self._pause(False)
        if self._detached_counted:
            self._metrics.session_detached(-1)
            self._detached_counted = False
        log.info(
            "request_id=%s peer=%s resumed after index %d: %d frame(s) replayed, %d parked",
            self.request_id,
            peer,
            last,
            len(frames),
            len(parked),
        )

    def refuse_resume(self, message: str, oldest: int | None) -> None:
        """This connection's `session.resume` is refused: `invalid_resume`, then close (no
        `session.done`: no session of this connection ended)."""
        self._start_timer.cancel()
        if not self._claim_end():
            return
        answer = protocol.error(ErrorCode.INVALID_RESUME, message)
        if oldest is not None:
            answer["oldest_resumable_index"] = oldest
        self._emit(answer, force=True)
        self._spawn(self._close_after_flush())

    async def _close_after_flush(self) -> None:
        await self._outbox.flush(FLUSH_SECONDS)
        self._conn.close(1000)

    def retire(self) -> None:
        """This connection's session.resume took another session over: this one never was."""
        self._start_timer.cancel()
        self._mark_closed()
        self._outbox.close()
        self._metrics.session_closed()
        self._on_closed(self)


def _after(delay: float) -> asyncio.Future[None]:
    """A future that is done in `delay` seconds (never cancelled: Tornado would abort the
    connection on a cancelled one)."""
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def done() -> None:
        if not future.done():
            future.set_result(None)

    asyncio.get_running_loop().call_later(delay, done)
    return future


def _raw_bytes(raw: str | bytes) -> bytes:
    return raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
