"""One writer per connection (`Outbox`): frames leave in order, a metadata text frame and its
binary frame back to back, and the bytes waiting for a slow reader are bounded.

Invariant: `on_taken` sees every frame the moment it is handed to the socket, in order, and
nothing else is written; what it returns is what is written (the session completes a
`session.done` there, rtvideo.proxy.session.ledger).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from typing import Any

from tornado.iostream import StreamClosedError
from tornado.websocket import WebSocketClosedError

from rtvideo.proxy.frames import Frame, Sink
from rtvideo.proxy.observability.metrics import ProxyMetrics

log = logging.getLogger(__name__)


class Outbox:
    """Queues + writer coroutine; awaits Tornado's write futures, so the socket sets the pace.

    `limit` bounds the bytes queued or being written: `put` refuses a frame that would
    exceed it (the caller ends the session with `slow_consumer`). Urgent frames (acks,
    pongs: small answers a client waits for) are written before queued video, so they
    never wait behind a backlog of chunks.
    """

    def __init__(
        self, sink: Sink, limit: int, metrics: ProxyMetrics, on_taken: Callable[[Frame], Frame | None]
    ) -> None:
        """`on_taken` sees each frame as the socket takes it and returns what is written; None:
        nothing is (the frame counts as taken: the client has it already, as after a takeover
        whose store lagged the chunks in flight, rtvideo.proxy.session.session `take_over`)."""
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
        connection (rtvideo.proxy.session.resume)."""
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
        taken = self._on_taken(frame)
        if taken is None:
            return
        frame = taken
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
                taken = self._on_taken(queued)
                if taken is None:  # taken, not written: the client has it already
                    self._pending -= queued.size
                    continue
                frame = taken
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
