"""The manager's watch loop: stalls, idle sequences, and the one periodic poll of Triton's cancellation.

Apart from `manager.py` because it is a thread of its own that needs only the session table,
the limits and the metrics; it reads the table under its lock, then calls the sessions
without it.
"""

from __future__ import annotations

import logging
import threading
import time

from rtvideo.backend.runtime.endings import EndReason
from rtvideo.backend.runtime.ports import Metrics
from rtvideo.backend.runtime.registry import SessionTable
from rtvideo.backend.runtime.session import Limits

log = logging.getLogger(__name__)


def watch(
    table: SessionTable,
    *,
    interval: float,
    closing: threading.Event,
    limits: Limits,
    metrics: Metrics,
    idle_timeout: float | None,
) -> None:
    """Every `interval`: end stalled sessions and sessions whose sequence Triton dropped as idle,
    and ask whether each live session's stream was cancelled. This is the one periodic poll of
    the runtime: Triton tells a model about a cancelled request only when asked
    (`is_cancelled()`, an IPC round trip that takes its turn with every session's sends), and
    nothing at all about a sequence it dropped, so one thread asks for all sessions at one
    rate, and the session's waits wake on the answer instead of polling themselves."""
    idle = idle_timeout
    while not closing.wait(interval):
        now = time.monotonic()
        watched = table.watched()
        sessions = [session for session, _ in watched]
        metrics.set_paused_sessions(sum(session.paused for session in sessions))
        for session, last_request in watched:
            # a paused session's stall clock stands still (docs/triton-model.md); its idle one runs
            if not session.paused and now - session.stats.last_progress > limits.stall_timeout_seconds:
                session.fail(EndReason.STALL_TIMEOUT, f"no generation progress for {limits.stall_timeout_seconds:g} s")
            elif idle is not None and last_request is not None and now - last_request > idle:
                session.fail(
                    EndReason.IDLE_TIMEOUT,
                    f"no request on the session's sequence for {idle:g} s: Triton ended the sequence "
                    f"(send a request, e.g. session.ping, at least every {idle / 2:g} s)",
                )
        for session in sessions:
            try:
                session.poll_cancelled()
            except Exception:
                log.exception("request_id=%s cancellation poll failed", session.request_id)
