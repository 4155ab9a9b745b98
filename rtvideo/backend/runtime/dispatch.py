"""Requests handled on one thread of ours, so Triton's `execute()` returns at once.

Triton runs a model instance's `execute()` calls one after another, each a round trip between
tritonserver and the stub: answering inside `execute()` would make every request wait for the
ones before it to be handled *and* answered. Handing each request to this thread lets Triton
deliver the next request while the previous one is answered (the same split as Triton's
vllm_backend, whose `execute()` only schedules work). One thread, first in first out, keeps
every sequence's requests in order, so no two requests of the model are handled at once.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

from rtvideo.backend.runtime.ports import Channel

log = logging.getLogger(__name__)

#: the manager's `on_request(corrid, payload, *, start, end, channel, received)`
Handler = Callable[..., None]


class RequestDispatcher:
    """A FIFO of requests and the thread that hands them to the session manager."""

    def __init__(self, handle: Handler) -> None:
        self._handle = handle
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="request-dispatch", daemon=True)
        self._thread.start()

    def submit(self, corrid: int, payload: bytes, *, start: bool, end: bool, channel: Channel) -> None:
        self._queue.put((corrid, payload, start, end, channel, time.monotonic()))

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            corrid, payload, start, end, channel, received = item
            try:
                self._handle(corrid, payload, start=start, end=end, channel=channel, received=received)
            except Exception:  # noqa: BLE001 - the handler answers its own failures; the thread must live
                log.exception("corrid=%s request handling failed", corrid)

    def close(self, timeout: float = 10.0) -> None:
        """Handle what is queued, then stop."""
        self._queue.put(None)
        self._thread.join(timeout)
