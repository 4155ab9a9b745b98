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
from rtvideo.triton.access import short_hash

log = logging.getLogger(__name__)

#: the manager's `on_request(corrid, payload, *, start, end, channel, received, secret)`
Handler = Callable[..., None]
#: handling one request this long means the request path is stuck: the model's heartbeat stops
#: (`moving`), so the proxy's supervisor takes the model for dead, not busy
STUCK_SECONDS = 5.0


class RequestDispatcher:
    """A FIFO of requests and the thread that hands them to the session manager."""

    def __init__(self, handle: Handler) -> None:
        self._handle = handle
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._handling_since: float | None = None  # when the request in hand was taken (monotonic)
        self._thread = threading.Thread(target=self._run, name="request-dispatch", daemon=True)
        self._thread.start()

    def moving(self) -> bool:
        """Whether requests get through: the thread lives and no request has been in hand for
        `STUCK_SECONDS` (the model's heartbeat beats only while this holds)."""
        since = self._handling_since
        return self._thread.is_alive() and (since is None or time.monotonic() - since < STUCK_SECONDS)

    def submit(
        self, corrid: int, payload: bytes, *, start: bool, end: bool, channel: Channel, secret: str | None = None
    ) -> None:
        self._queue.put((corrid, payload, start, end, channel, time.monotonic(), secret))

    def call_soon(self, fn: Callable[[], None]) -> None:
        """Run `fn` on this thread after the requests queued so far (work another thread
        finished for a request, e.g. a fetched image_reference, goes on in order here)."""
        self._queue.put(fn)

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            self._handling_since = time.monotonic()
            try:
                if callable(item):
                    item()
                    continue
                corrid, payload, start, end, channel, received, secret = item
                self._handle(corrid, payload, start=start, end=end, channel=channel, received=received, secret=secret)
            except Exception:
                log.exception(
                    "sequence=%s request handling failed", short_hash(item[0]) if isinstance(item, tuple) else "-"
                )
            finally:
                self._handling_since = None

    def close(self, timeout: float = 10.0) -> None:
        """Handle what is queued, then stop."""
        self._queue.put(None)
        self._thread.join(timeout)
