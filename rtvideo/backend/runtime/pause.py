"""The pause of one session (a detached proxy session: docs/triton-model.md "Pausing a session").

Its own class because the request path sets it, the worker holds on it and the watchdog
reads it, and none of that needs the rest of the session. It is not under the session's
locks: a flag read at chunk boundaries, and events to wake the wait.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

#: the longest a session stays paused (a proxy's resume grace is far shorter); then it goes on
MAX_PAUSE_SECONDS = 600.0
#: how often a paused worker looks for a stop, a cancellation or the end
PAUSE_POLL_SECONDS = 0.2


class PauseGate:
    """Whether a session is paused, since when, and the worker's wait while it is.

    `touch` restarts the session's stall clock: on a resume, and when the wait ends, so the
    time spent paused never counts as a stall.
    """

    def __init__(self, request_id: str, touch: Callable[[], None]) -> None:
        self._request_id = request_id
        self._touch = touch
        self._paused = False  # set by the request path (`set`); read by the worker
        self._since: float | None = None
        self._unpaused = threading.Event()  # set when a pause is lifted (the wait wakes on it)

    @property
    def holding(self) -> bool:
        """Whether the worker should hold at its next boundary (the pause is on, however long)."""
        return self._paused

    @property
    def paused(self) -> bool:
        """Paused and within MAX_PAUSE_SECONDS: the stall clock does not run (watchdog.watch)."""
        since = self._since
        return self._paused and since is not None and time.monotonic() - since < MAX_PAUSE_SECONDS

    def set(self, paused: bool) -> None:
        """Pause at the next chunk boundary or go on (see `Session.set_paused`)."""
        if paused and not self._paused:
            self._since = time.monotonic()
            self._unpaused.clear()
            self._paused = True
            log.info("request_id=%s paused", self._request_id)
        elif not paused and self._paused:
            self._paused = False
            self._touch()
            self._unpaused.set()
            log.info("request_id=%s resumed", self._request_id)

    def hold(self, wake: threading.Event) -> float:
        """Wait while paused (until lifted, `wake` is set by a stop, a cancellation or the end, or
        MAX_PAUSE_SECONDS); returns the seconds waited, which the caller takes off the
        session-length clock."""
        began = time.monotonic()
        while self._paused and not wake.is_set():
            if time.monotonic() - (self._since or began) >= MAX_PAUSE_SECONDS:
                log.warning("request_id=%s paused over %g s: going on", self._request_id, MAX_PAUSE_SECONDS)
                self._paused = False
                break
            self._unpaused.wait(PAUSE_POLL_SECONDS)  # a stop sets `wake`, seen within a poll
        self._touch()
        return time.monotonic() - began
