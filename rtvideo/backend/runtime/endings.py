"""How a session ends (`EndReason`) and the answer to a request that finds it ended.

Apart from `session.py` because the manager, the admission desk and the session all name
these ends, and none of them should have to import another for it.
"""

from __future__ import annotations

import enum
from typing import Any

from rtvideo.core import server_messages
from rtvideo.core.errors import ErrorCode


def ended_error(request_id: str | None) -> dict[str, Any]:
    """The answer to a request that arrives after the session ended (or never started)."""
    if request_id is None:
        return server_messages.error(ErrorCode.INVALID_MESSAGE, "this sequence has no running session")
    return server_messages.error(ErrorCode.INVALID_MESSAGE, "the session has ended", request_id=request_id)


class EndReason(enum.Enum):
    """How a session ended, and what that end implies (docs/protocol.md §2.3, §7).

    Each member is (label, stopped, sends, error): the `rtvideo_session_ends_total` reason
    label; `session.done`'s `stopped`; whether anything is sent (else the start request
    completes flags-only); the code of the `error` sent before `session.done`. The ends
    the worker reaches itself (complete, limit, stopped) send the trailer first; a failure
    sends none. Not a wire concept: the wire carries only its consequences.
    """

    COMPLETE = ("complete", False, True, None)  # the session's num_frames are out
    LIMIT = ("limit", False, True, None)  # max_session_seconds
    STOPPED = ("stopped", True, True, None)  # session.stop, sequence_end, or a new start on the sequence
    CANCELLED = ("cancelled", False, False, None)  # the client cancelled the stream: nothing can reach it
    GENERATION_FAILED = ("generation_failed", False, True, ErrorCode.GENERATION_FAILED)
    STALL_TIMEOUT = ("stall_timeout", False, True, ErrorCode.STALL_TIMEOUT)
    # no request on the sequence for Triton's idle limit: Triton dropped the sequence (watchdog.watch)
    IDLE_TIMEOUT = ("idle_timeout", False, True, ErrorCode.IDLE_TIMEOUT)
    BACKEND_UNAVAILABLE = ("backend_unavailable", False, True, ErrorCode.BACKEND_UNAVAILABLE)  # shutdown

    def __init__(self, label: str, stopped: bool, sends: bool, error: ErrorCode | None) -> None:
        self.label = label
        self.stopped = stopped
        self.sends = sends
        self.error = error
