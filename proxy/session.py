"""One WebSocket session translated onto one Triton sequence (docs/protocol.md §2–3, §7–8).

The proxy checks only what it must answer itself (first message, size, JSON, type,
binary frames) and forwards every other message verbatim; the model validates the
rest. Each session ends exactly once: the model's `session.done`, or an end the proxy
reports itself (`start_timeout`, `invalid_start`, `slow_consumer`, `backend_unavailable`,
`server_shutdown`), or the client going away. In every case the Triton sequence is ended before the
stream is dropped, so its slot is freed.

Where a session is lives in one `Phase`; what may be written when is decided by its
`OutboundOrder` (rtvideo.proxy.ordering), which the session feeds and obeys.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol

from rtvideo.core import protocol
from rtvideo.core.errors import ErrorCode, ProtocolError
from rtvideo.proxy.bridge import BackendUnavailable, TritonStream
from rtvideo.wire import START_TAG, Reply
from rtvideo.proxy.ledger import Ledger
from rtvideo.proxy.metrics import ProxyMetrics
from rtvideo.proxy.ordering import OutboundOrder, Send
from rtvideo.proxy.outbox import Frame, Outbox, Sink
from rtvideo.proxy.settings import ProxySettings

log = logging.getLogger(__name__)

#: how long a chunk may wait for the ack of an event it names (the ack is already on its way)
ACK_WAIT_SECONDS = 1.0
#: how long to wait for Triton to confirm the end of the sequence before dropping the stream
END_GRACE_SECONDS = 3.0
#: how long the last messages of a session may take to reach a client before the close
FLUSH_SECONDS = 10.0
_STOP = protocol.encode({"type": protocol.STOP}).encode()


class Connection(Sink, Protocol):
    """The WebSocket (Tornado's handler): writes and a close."""

    def close(self, code: int | None = None, reason: str | None = None) -> None: ...


class StreamSource(Protocol):
    """Where a session's Triton stream comes from: a `TritonBridge` (one server), or the
    `EndpointPool` that places it over many (rtvideo.proxy.placement)."""

    def open_stream(self) -> TritonStream: ...


class Phase(enum.Enum):
    """Where a session is. Moves forward only: AWAITING_START → STREAMING → STOP_SENT, then
    one end (REFUSED before a session.start was forwarded, ENDING after), then CLOSED."""

    AWAITING_START = enum.auto()  # connected; the first message decides
    STREAMING = enum.auto()  # the sequence is open: client messages go to Triton
    STOP_SENT = enum.auto()  # sequence_end went to Triton: pings are answered, model replies still go out
    REFUSED = enum.auto()  # the first message was refused or never came: error, done, close; no sequence
    ENDING = enum.auto()  # the end is claimed: nothing more forwarded or accepted; end sequence, flush, close
    CLOSED = enum.auto()  # the WebSocket is closed


#: phases in which replies (Triton's and the proxy's own) still go to the client
_LIVE = frozenset({Phase.AWAITING_START, Phase.STREAMING, Phase.STOP_SENT})


@dataclass(frozen=True)
class _OwnAnswer:
    """An answer the proxy writes itself (pong, error about one message). Built when it is
    written, so that an error held behind video.start names the request."""

    build: Callable[[], Mapping[str, Any]]


_Item = Reply | _OwnAnswer


class ProxySession:
    """The state of one connection; every method runs on the proxy's event loop."""

    def __init__(
        self, conn: Connection, bridge: StreamSource, settings: ProxySettings, metrics: ProxyMetrics,
        peer: str, on_closed: Callable[["ProxySession"], None],
    ) -> None:
        self._conn = conn
        self._bridge = bridge
        self._settings = settings
        self._metrics = metrics
        self.peer = peer
        self._on_closed = on_closed
        self.ledger = Ledger()
        self.request_id: str | None = None  # from video.start, once forwarded
        self._phase = Phase.AWAITING_START
        self._outbox = Outbox(conn, settings.outbound_buffer_bytes, metrics, self._taken)
        self._order: OutboundOrder[_Item] = OutboundOrder(ack_wait=ACK_WAIT_SECONDS)
        self._ack_timer: asyncio.TimerHandle | None = None
        self._stream: TritonStream | None = None  # the Triton sequence, while there is one to end
        self._stop_tag: str | None = None  # the request that carried sequence_end
        self._sequence_ended = asyncio.Event()  # Triton delivered that request to the model
        self._closed = asyncio.Event()  # the WebSocket is closed (awaited by shutdown)
        self._interactions: dict[str, float] = {}  # request tag → when the client's frame arrived
        self._tasks: set[asyncio.Task] = set()
        self._opened = time.monotonic()
        self._timing = metrics.stream_timing()  # time to first chunk, chunk lead
        self._start_timer = asyncio.get_running_loop().call_later(settings.start_timeout, self._start_timed_out)
        metrics.session_opened()

    # --- phase transitions -----------------------------------------------------------------
    def _open_sequence(self, stream: TritonStream) -> None:
        """AWAITING_START → STREAMING: session.start went to Triton on its own stream."""
        self._stream, self._phase = stream, Phase.STREAMING

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

    def _mark_closed(self) -> Phase:
        """Any phase → CLOSED; returns the phase it left."""
        left, self._phase = self._phase, Phase.CLOSED
        self._closed.set()
        return left

    # --- client → Triton -------------------------------------------------------------------
    def on_frame(self, raw: str | bytes, binary: bool) -> None:
        """A frame from the client: early checks, then forwarded verbatim (or answered here)."""
        if self._phase is Phase.AWAITING_START:
            self._on_first(raw, binary)
            return
        if self._phase not in (Phase.STREAMING, Phase.STOP_SENT):
            return  # the end is claimed: frames still buffered behind it are ignored
        try:
            kind = protocol.decode_later(raw, binary=binary)["type"]
        except ProtocolError as exc:
            self._reject(exc.code, exc.message)
            return
        if self._phase is Phase.STOP_SENT:  # the sequence is closed
            if kind == protocol.PING:
                self._answer(protocol.pong)
            elif kind != protocol.STOP:
                self._reject(ErrorCode.INVALID_MESSAGE, "session.stop was sent; the session is ending")
        else:
            assert self._stream is not None  # STREAMING
            tag = self._stream.send(_raw_bytes(raw), end=kind == protocol.STOP)
            if kind == protocol.STOP:
                self._stop_sent(tag)
            elif kind == protocol.INTERACTION:
                self._interactions[tag] = time.perf_counter()

    def _on_first(self, raw: str | bytes, binary: bool) -> None:
        self._start_timer.cancel()
        try:
            protocol.check_first_message(raw, binary=binary)
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
    async def _pump(self, stream: TritonStream) -> None:
        try:
            async for reply in stream.replies():
                self._on_reply(reply)
            if self._phase in _LIVE:
                raise BackendUnavailable("Triton ended the stream before session.done")
        except BackendUnavailable as exc:
            self._stream = None  # nothing left to end on Triton's side
            stream.cancel()
            self._sequence_ended.set()
            if self._phase in _LIVE:
                log.warning("request_id=%s peer=%s backend failure: %s", self.request_id, self.peer, exc)
                self._fail(ErrorCode.BACKEND_UNAVAILABLE, "the video backend is unavailable; try again later")

    def _on_reply(self, reply: Reply) -> None:
        kind = reply.message.get("type")
        if reply.tag == self._stop_tag or (kind == protocol.DONE and reply.message.get("stopped")):
            self._sequence_ended.set()  # the model saw sequence_end: its slot is free
        if reply.tag == self._stop_tag or self._phase not in _LIVE:
            return  # the answer to session.stop is the trailer and session.done, not this
        if reply.tag == START_TAG:
            self._deliver(self._order.stream(reply, reply.message, time.monotonic()))
        else:  # the answer to one later request (ack, pong, per-message error)
            ack = reply.message["event_id"] if kind == protocol.QUEUED else None
            self._deliver(self._order.answer(reply, len(reply.text) + len(reply.data), ack))

    def _reject(self, code: ErrorCode, text: str) -> None:
        """An error about one client message; the session goes on."""
        self._answer(lambda: protocol.error(code, text, request_id=self.request_id))

    def _answer(self, build: Callable[[], Mapping[str, Any]]) -> None:
        """An answer of the proxy's own: ordered and bounded like any reply."""
        self._deliver(self._order.answer(_OwnAnswer(build), len(protocol.encode(build()))))

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
            elif not self._emit(send.item.build(), urgent=send.urgent):
                self._slow_consumer()
        if self._phase in _LIVE:
            self._arm_ack_timer()

    def _forward(self, reply: Reply, urgent: bool) -> None:
        message = reply.message
        kind = message.get("type")
        received = self._interactions.pop(reply.tag, None)
        if kind == protocol.VIDEO_START:
            self.request_id = message.get("request_id")
            log.info("request_id=%s peer=%s session started", self.request_id, self.peer)
        data = reply.data if kind == protocol.CHUNK_METADATA else None
        if not self._emit(message, text=reply.text, data=data, urgent=urgent):
            self._slow_consumer()
        elif kind == protocol.DONE and self._claim_end():
            self._spawn(self._finish(FLUSH_SECONDS))
        if kind == protocol.QUEUED:
            if received is not None:
                self._metrics.observe_ack(time.perf_counter() - received)
            log.debug("request_id=%s event_id=%s queued", self.request_id, message["event_id"])

    def _emit(self, message: Mapping[str, Any], *, text: str | None = None, data: bytes | None = None,
              urgent: bool = False, force: bool = False) -> bool:
        if message.get("type") == protocol.ERROR:
            self._metrics.error_sent(str(message.get("code")))
        frame = Frame(text if text is not None else protocol.encode(message), message, data)
        return self._outbox.put(frame, urgent=urgent, force=force)

    def _slow_consumer(self) -> None:
        self._fail(
            ErrorCode.SLOW_CONSUMER,
            f"the client reads too slowly: more than {self._settings.outbound_buffer_bytes} bytes are waiting",
        )

    def _taken(self, frame: Frame) -> None:
        self.ledger.observe(frame.message, frame.data is not None)
        self._timing.taken(frame.message)
        self._order.handed_out(frame.message)

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
            log.warning("request_id=%s released %d message(s) whose ack did not arrive in %.1f s",
                        self.request_id, len(released), self._order.ack_wait)
        self._deliver(released)

    # --- ending ----------------------------------------------------------------------------
    def backend_lost(self, reason: str) -> None:
        """The supervisor found the backend down: end with `backend_unavailable` and `session.done`,
        then close, without waiting for the model to confirm the end of the sequence."""
        if self._phase not in _LIVE:
            return
        log.warning("request_id=%s peer=%s backend down: %s", self.request_id, self.peer, reason)
        self._sequence_ended.set()  # the stop is still sent, but nobody may be there to confirm it
        self._fail(ErrorCode.BACKEND_UNAVAILABLE, "the video backend is unavailable; try again later")

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
        """Error, `session.done` (from the ledger: what the client was actually sent), close."""
        if code is ErrorCode.SLOW_CONSUMER or not await self._outbox.flush(1.0):
            self._outbox.discard()  # the client cannot take more; the end must still fit
        # Nothing is queued now but the error: the ledger has seen every frame before the done.
        self._emit(protocol.error(code, message, request_id=self.request_id), force=True)
        self._emit(self.ledger.done(), force=True)
        await self._finish(1.0 if code is ErrorCode.SLOW_CONSUMER else FLUSH_SECONDS, close_code)

    async def _finish(self, flush_seconds: float, close_code: int = 1000) -> None:
        """After the session's last message: end the sequence, flush, close (normally, by default)."""
        await self._end_sequence()
        await self._outbox.flush(flush_seconds)
        self._conn.close(close_code)

    async def _end_sequence(self) -> None:
        """Send `sequence_end` if not done yet, wait (bounded) until the model has it, drop the stream."""
        stream = self._stream
        if stream is None:
            return  # never opened, or broken
        if self._stop_tag is None:
            self._stop_tag = stream.send(_STOP, end=True)
        try:
            await asyncio.wait_for(self._sequence_ended.wait(), END_GRACE_SECONDS)
        except asyncio.TimeoutError:
            log.warning("request_id=%s Triton did not confirm the end of sequence %d", self.request_id, stream.sequence_id)
        stream.cancel()

    def on_disconnect(self) -> None:
        """The WebSocket is closed (by either side): free everything, exactly once."""
        left = self._mark_closed()
        if left is Phase.CLOSED:
            return
        self._start_timer.cancel()
        if self._ack_timer is not None:
            self._ack_timer.cancel()
        self._outbox.close()
        if left in _LIVE:  # no end was claimed: the sequence is still open
            self._spawn(self._end_sequence())
        self._metrics.session_closed()
        log.info("request_id=%s peer=%s session ended chunks=%d after %.1f s", self.request_id, self.peer,
                 self.ledger.chunks, time.monotonic() - self._opened)
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
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _raw_bytes(raw: str | bytes) -> bytes:
    return raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
