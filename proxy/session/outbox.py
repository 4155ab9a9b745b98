"""One writer per connection: frames leave in order, a metadata text frame and its binary
frame back to back, and the bytes waiting for a slow reader are bounded.

Invariant: `on_taken` sees every frame the moment it is handed to the socket, in order, and
nothing else is written; what it returns is what is written (the session completes a
`session.done` there, rtvideo.proxy.session.ledger)."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from tornado.iostream import StreamClosedError
from tornado.websocket import WebSocketClosedError

from rtvideo.proxy.observability.metrics import ProxyMetrics

log = logging.getLogger(__name__)


class Sink(Protocol):
    """What Tornado's `WebSocketHandler` offers for writing."""

    def write_message(self, message: str | bytes, binary: bool = False) -> Awaitable[None]: ...


@dataclass(frozen=True)
class Frame:
    """A text frame (`message` is its parsed form), or a metadata text frame with the binary
    payload that follows it."""

    text: str
    message: Mapping[str, Any] = field(compare=False)
    data: bytes | None = None
    size: int = field(init=False)  # bytes on the wire (payloads), for the buffer bound and metrics
    #: a frame sent again on a resumed connection (or a watcher's own): the session's ledger and
    #: timing saw it the first time (or never concern it), so `on_taken` passes it through
    replay: bool = field(default=False, compare=False)

    def __post_init__(self) -> None:
        size = len(self.text.encode("utf-8")) + (len(self.data) if self.data is not None else 0)
        object.__setattr__(self, "size", size)


class Outbox:
    """Queues + writer coroutine; awaits Tornado's write futures, so the socket sets the pace.

    `limit` bounds the bytes queued or being written: `put` refuses a frame that would
    exceed it (the caller ends the session with `slow_consumer`). Urgent frames (acks,
    pongs: small answers a client waits for) are written before queued video, so they
    never wait behind a backlog of chunks.
    """

    def __init__(self, sink: Sink, limit: int, metrics: ProxyMetrics, on_taken: Callable[[Frame], Frame]) -> None:
        self._sink = sink
        self._limit = limit
        self._metrics = metrics
        self._on_taken = on_taken
        self._queue: deque[Frame] = deque()
        self._urgent: deque[Frame] = deque()
        self._pending = 0  # bytes queued or in the write in progress
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._closed = False
        self._task = asyncio.ensure_future(self._run())

    def put(self, frame: Frame, *, urgent: bool = False, force: bool = False) -> bool:
        """Queue a frame; False (nothing queued) when the reader is too far behind,
        unless `force` (the few closing messages of a session)."""
        if self._closed:
            return True  # the connection is gone: nothing to bound any more
        if not force and self._pending and self._pending + frame.size > self._limit:
            return False
        (self._urgent if urgent else self._queue).append(frame)
        self._pending += frame.size
        self._idle.clear()
        self._wake.set()
        return True

    def discard(self) -> None:
        """Drop what is still queued (not the pair being written)."""
        for queue in (self._urgent, self._queue):
            self._pending -= sum(f.size for f in queue)
            queue.clear()

    def take_unsent(self) -> list[Frame]:
        """Remove and return what is queued and not handed to the socket yet, in the order it
        would have been written (urgent first): a detached session keeps it for its next
        connection (rtvideo.proxy.participants.resume)."""
        frames = [*self._urgent, *self._queue]
        self.discard()
        return frames

    def write_now(self, frame: Frame) -> None:
        """Hand `frame` to the socket at once, behind what was handed already; call `discard` first,
        so that nothing queued is overtaken. For a session's last messages to a client that does
        not read: Tornado buffers them behind the write in progress, so a client that reads again
        before the close times out still finds them, in order. Queued instead, they would wait
        behind a write that never completes, and the close would go out without them."""
        if self._closed:
            return
        frame = self._on_taken(frame)
        try:
            writes = [self._sink.write_message(frame.text)]
            if frame.data is not None:
                writes.append(self._sink.write_message(frame.data, binary=True))
        except (WebSocketClosedError, StreamClosedError):
            return
        for write in writes:  # awaited by no one: a connection closed meanwhile is no error
            asyncio.ensure_future(write).add_done_callback(_consume)
        self._metrics.sent(frame.size, frame.data is not None)

    async def flush(self, timeout: float) -> bool:
        """Wait until everything queued was written; False on timeout or a closed connection."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return not self._closed

    def close(self) -> None:
        """Stop writing (the connection is gone)."""
        self._closed = True
        self._urgent.clear()
        self._queue.clear()
        self._pending = 0
        self._idle.set()
        self._task.cancel()

    async def _run(self) -> None:
        try:
            while True:
                if not (self._urgent or self._queue):
                    self._idle.set()
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                queued = (self._urgent or self._queue).popleft()
                frame = self._on_taken(queued)
                # Both writes are issued before any await: nothing can come between them.
                writes = [self._sink.write_message(frame.text)]
                if frame.data is not None:
                    writes.append(self._sink.write_message(frame.data, binary=True))
                for write in writes:
                    await write
                self._pending -= queued.size
                self._metrics.sent(frame.size, frame.data is not None)
        except (WebSocketClosedError, StreamClosedError):
            log.debug("connection closed while writing")
        finally:
            self._closed = True
            self._idle.set()


def _consume(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()
