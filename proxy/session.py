"""One WebSocket session translated onto one Triton sequence (docs/protocol.md §2–3, §7–8).

The proxy checks only what it must answer itself (first message, size, JSON, type,
binary frames) and forwards every other message verbatim; the model validates the
rest. Each session ends exactly once: the model's `session.done`, or an end the proxy
reports itself (`start_timeout`, `invalid_start`, `slow_consumer`, `backend_unavailable`),
or the client going away. In every case the Triton sequence is ended before the
stream is dropped, so its slot is freed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable, Mapping, Protocol

from rtvideo.core import protocol
from rtvideo.core.errors import ErrorCode, ProtocolError
from rtvideo.proxy.bridge import START_TAG, BackendUnavailable, Reply, TritonBridge, TritonStream
from rtvideo.proxy.ledger import Ledger
from rtvideo.proxy.metrics import ProxyMetrics
from rtvideo.proxy.ordering import AckGate, named_event_ids
from rtvideo.proxy.outbox import Frame, Outbox, Sink
from rtvideo.proxy.settings import ProxySettings

log = logging.getLogger("rtvideo.proxy")

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


class ProxySession:
    """The state of one connection; every method runs on the proxy's event loop."""

    def __init__(
        self, conn: Connection, bridge: TritonBridge, settings: ProxySettings, metrics: ProxyMetrics,
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
        self._outbox = Outbox(conn, settings.outbound_buffer_bytes, metrics, self._taken)
        self._gate: AckGate[Reply] = AckGate()
        self._gate_timer: asyncio.TimerHandle | None = None
        self._stream: TritonStream | None = None
        self._sequence_open = False  # a request with sequence_end has not been sent yet
        self._stop_tag: str | None = None  # the request that carried sequence_end
        self._sequence_ended = asyncio.Event()  # Triton delivered that request to the model
        self._stream_broken = False
        self._forwarding = True  # model replies still go to the client
        self._ending = False  # the end is decided (set synchronously, before any task reports it)
        self._early: list[Callable[[], None]] | None = []  # answers held until video.start is forwarded
        self._early_bytes = 0
        self._closed = asyncio.Event()  # the WebSocket is closed
        self._interactions: dict[str, float] = {}  # request tag → when the client's frame arrived
        self._tasks: set[asyncio.Task] = set()
        self._opened = time.monotonic()
        self._start_timer = asyncio.get_running_loop().call_later(settings.start_timeout, self._start_timed_out)
        metrics.session_opened()

    # --- client → Triton -------------------------------------------------------------------
    def on_frame(self, raw: str | bytes, binary: bool) -> None:
        """A frame from the client: early checks, then forwarded verbatim (or answered here)."""
        if self._ending:
            return
        if self._stream is None:
            self._on_first(raw, binary)
            return
        if binary:
            self._reject(ErrorCode.INVALID_MESSAGE, "binary frames are not accepted from clients; send JSON text")
            return
        try:
            kind = protocol.decode_object(raw, protocol.MAX_MESSAGE_BYTES)["type"]
        except ProtocolError as exc:
            self._reject(exc.code, exc.message)
            return
        if kind == protocol.START:
            self._reject(ErrorCode.INVALID_MESSAGE, "the session has already started")
        elif not self._sequence_open:  # session.stop went to Triton: the sequence is closed
            if kind == protocol.PING:
                self._answer(protocol.pong)
            elif kind != protocol.STOP:
                self._reject(ErrorCode.INVALID_MESSAGE, "session.stop was sent; the session is ending")
        else:
            tag = self._stream.send(_raw_bytes(raw), end=kind == protocol.STOP)
            if kind == protocol.STOP:
                self._sequence_open, self._stop_tag = False, tag
            elif kind == protocol.INTERACTION:
                self._interactions[tag] = time.perf_counter()

    def _on_first(self, raw: str | bytes, binary: bool) -> None:
        self._start_timer.cancel()
        try:
            if binary:
                raise ProtocolError(ErrorCode.INVALID_START, "the first message must be a session.start text frame")
            kind = protocol.decode_object(raw, protocol.MAX_START_BYTES)["type"]
            if kind != protocol.START:
                raise ProtocolError(ErrorCode.INVALID_START, f"first message must be session.start, not {kind}")
        except ProtocolError as exc:
            code = exc.code if exc.code is ErrorCode.MESSAGE_TOO_LARGE else ErrorCode.INVALID_START
            message = exc.message if code is exc.code else f"first message must be session.start: {exc.message}"
            self._fail(code, message)  # claims the end now: frames already buffered are ignored
            return
        self._stream = self._bridge.open_stream()
        self._stream.send(_raw_bytes(raw), start=True)
        self._sequence_open = True
        self._spawn(self._pump(self._stream))

    def _start_timed_out(self) -> None:
        if self._stream is None:
            self._fail(ErrorCode.START_TIMEOUT, f"no session.start within {self._settings.start_timeout:g} s")

    # --- Triton → client -------------------------------------------------------------------
    async def _pump(self, stream: TritonStream) -> None:
        try:
            async for reply in stream.replies():
                self._on_reply(reply)
            if not self._ending:
                raise BackendUnavailable("Triton ended the stream before session.done")
        except BackendUnavailable as exc:
            self._stream_broken = True  # nothing left to end on Triton's side
            self._sequence_ended.set()
            if not self._ending:
                log.warning("request_id=%s peer=%s backend failure: %s", self.request_id, self.peer, exc)
                self._fail(ErrorCode.BACKEND_UNAVAILABLE, "the video backend is unavailable; try again later")

    def _on_reply(self, reply: Reply) -> None:
        kind = reply.message.get("type")
        if reply.tag == self._stop_tag or (kind == protocol.DONE and reply.message.get("stopped")):
            self._sequence_ended.set()  # the model saw sequence_end: its slot is free
        if reply.tag == self._stop_tag or not self._forwarding:
            return  # the answer to session.stop is the trailer and session.done, not this
        if reply.tag == START_TAG:
            for item in self._gate.admit(reply, named_event_ids(reply.message)):
                self._forward(item)
            self._arm_gate_timer()
            return
        if self._early is not None:  # an answer that overtook video.start on the gRPC stream: wait behind it
            self._hold(lambda: self._on_answer(reply), len(reply.text) + len(reply.data))
            return
        self._on_answer(reply)

    def _on_answer(self, reply: Reply) -> None:
        """The answer to one later request (ack, pong, per-message error), once video.start is out."""
        kind = reply.message.get("type")
        received = self._interactions.pop(reply.tag, None)
        self._forward(reply, urgent=True)
        if kind == protocol.QUEUED:
            if received is not None:
                self._metrics.observe_ack(time.perf_counter() - received)
            log.debug("request_id=%s event_id=%s queued", self.request_id, reply.message["event_id"])
            for item in self._gate.ack(reply.message["event_id"]):
                self._forward(item)

    def _forward(self, reply: Reply, urgent: bool = False) -> None:
        """To the client; `urgent`: the answer to one request, which may overtake queued video."""
        if not self._forwarding:
            return
        message = reply.message
        if message.get("type") == protocol.VIDEO_START:
            self.request_id = message.get("request_id")
            log.info("request_id=%s peer=%s session started", self.request_id, self.peer)
        data = reply.data if message.get("type") == protocol.CHUNK_METADATA else None
        if not self._emit(message, text=reply.text, data=data, urgent=urgent):
            self._slow_consumer()
        elif message.get("type") == protocol.DONE:
            self._ending, self._forwarding = True, False
            self._spawn(self._finish(FLUSH_SECONDS))
        elif message.get("type") == protocol.VIDEO_START:
            early, self._early = self._early or [], None
            for release in early:  # queued behind video.start, in arrival order
                release()

    def _emit(self, message: Mapping[str, Any], *, text: str | None = None, data: bytes | None = None,
              urgent: bool = False, force: bool = False) -> bool:
        if message.get("type") == protocol.ERROR:
            self._metrics.error_sent(str(message.get("code")))
        frame = Frame(text if text is not None else protocol.encode(message), message, data)
        # Nothing overtakes video.start: urgency starts once it was handed to the socket.
        return self._outbox.put(frame, urgent=urgent and self.ledger.request_id is not None, force=force)

    def _reject(self, code: ErrorCode, text: str) -> None:
        """An error about one client message; the session goes on."""
        self._answer(lambda: protocol.error(code, text, request_id=self.request_id))

    def _answer(self, build: Callable[[], Mapping[str, Any]]) -> None:
        """An answer of the proxy's own (pong, error about one message): urgent, but never ahead of
        video.start, and bounded like any reply (refused by a full buffer → slow_consumer)."""
        if self._ending:
            return
        if self._early is not None:
            self._hold(lambda: self._answer(build), len(protocol.encode(build())))
        elif not self._emit(build(), urgent=True):
            self._slow_consumer()

    def _hold(self, release: Callable[[], None], size: int) -> None:
        """Keep an answer until video.start is forwarded; held bytes count against the outbound bound."""
        assert self._early is not None
        self._early_bytes += size
        if self._early_bytes > self._settings.outbound_buffer_bytes:
            self._slow_consumer()
        else:
            self._early.append(release)

    def _slow_consumer(self) -> None:
        self._fail(
            ErrorCode.SLOW_CONSUMER,
            f"the client reads too slowly: more than {self._settings.outbound_buffer_bytes} bytes are waiting",
        )

    def _taken(self, frame: Frame) -> None:
        self.ledger.observe(frame.message, frame.data is not None)

    def _arm_gate_timer(self) -> None:
        if self._gate.held_since is not None and self._gate_timer is None:
            self._gate_timer = asyncio.get_running_loop().call_later(ACK_WAIT_SECONDS, self._gate_expired)

    def _gate_expired(self) -> None:
        self._gate_timer = None
        held = self._gate.release_all()
        if held:
            log.warning("request_id=%s released %d message(s) whose ack did not arrive in %.1f s",
                        self.request_id, len(held), ACK_WAIT_SECONDS)
        for item in held:
            self._forward(item)

    # --- ending ----------------------------------------------------------------------------
    def backend_lost(self, reason: str) -> None:
        """The supervisor found the backend down: end with `backend_unavailable` and `session.done`,
        then close, without waiting for the model to confirm the end of the sequence."""
        if self._ending:
            return
        log.warning("request_id=%s peer=%s backend down: %s", self.request_id, self.peer, reason)
        self._sequence_ended.set()  # the stop is still sent, but nobody may be there to confirm it
        self._fail(ErrorCode.BACKEND_UNAVAILABLE, "the video backend is unavailable; try again later")

    def _fail(self, code: ErrorCode, message: str) -> None:
        """End the session from the proxy's side. The end is claimed at once, so nothing else is
        forwarded or accepted, not even later in the current synchronous burst; a task reports it."""
        if self._ending:
            return
        self._ending, self._forwarding = True, False
        self._spawn(self._report_failure(code, message))

    async def _report_failure(self, code: ErrorCode, message: str) -> None:
        """Error, `session.done` (from the ledger: what the client was actually sent), close."""
        if code is ErrorCode.SLOW_CONSUMER or not await self._outbox.flush(1.0):
            self._outbox.discard()  # the client cannot take more; the end must still fit
        # Nothing is queued now but the error: the ledger has seen every frame before the done.
        self._emit(protocol.error(code, message, request_id=self.request_id), force=True)
        self._emit(self.ledger.done(), force=True)
        await self._finish(1.0 if code is ErrorCode.SLOW_CONSUMER else FLUSH_SECONDS)

    async def _finish(self, flush_seconds: float) -> None:
        """After the session's last message: end the sequence, flush, close normally."""
        await self._end_sequence()
        await self._outbox.flush(flush_seconds)
        self._conn.close(1000)

    async def _end_sequence(self) -> None:
        """Send `sequence_end` if not done yet, wait (bounded) until the model has it, drop the stream."""
        stream = self._stream
        if stream is None:
            return
        if self._sequence_open and not self._stream_broken:
            self._sequence_open = False
            self._stop_tag = stream.send(_STOP, end=True)
        try:
            await asyncio.wait_for(self._sequence_ended.wait(), END_GRACE_SECONDS)
        except asyncio.TimeoutError:
            log.warning("request_id=%s Triton did not confirm the end of sequence %d", self.request_id, stream.sequence_id)
        stream.cancel()

    def on_disconnect(self) -> None:
        """The WebSocket is closed (by either side): free everything, exactly once."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._start_timer.cancel()
        if self._gate_timer is not None:
            self._gate_timer.cancel()
        self._outbox.close()
        self._forwarding = False
        if not self._ending:
            self._ending = True
            self._spawn(self._end_sequence())
        self._metrics.session_closed()
        log.info("request_id=%s peer=%s session ended chunks=%d after %.1f s", self.request_id, self.peer,
                 self.ledger.chunks, time.monotonic() - self._opened)
        self._on_closed(self)

    async def shutdown(self, timeout: float) -> None:
        """Server shutdown: stop generation like a client's session.stop, then close."""
        if self._stream is None:
            self._conn.close(1001, "server shutting down")  # no session.start yet
        elif self._sequence_open and not self._ending:
            self.on_frame(_STOP.decode(), binary=False)
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
