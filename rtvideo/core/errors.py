"""The one stable list of error codes and the core's only exception type."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class ErrorCode(str, Enum):
    """Codes sent in `error` messages; clients switch on these, so never rename one."""

    INVALID_JSON = "invalid_json"
    INVALID_MESSAGE = "invalid_message"
    MESSAGE_TOO_LARGE = "message_too_large"
    START_TIMEOUT = "start_timeout"
    INVALID_START = "invalid_start"
    UNSUPPORTED_FORMAT = "unsupported_format"
    MODEL_MISMATCH = "model_mismatch"
    INVALID_INTERACTION = "invalid_interaction"
    EVENT_ID_CONFLICT = "event_id_conflict"
    INTERACTION_FAILED = "interaction_failed"
    STALL_TIMEOUT = "stall_timeout"
    IDLE_TIMEOUT = "idle_timeout"  # no request on the sequence for Triton's idle limit: Triton dropped it
    SERVER_BUSY = "server_busy"
    GENERATION_FAILED = "generation_failed"
    BACKEND_UNAVAILABLE = "backend_unavailable"
    SLOW_CONSUMER = "slow_consumer"
    RATE_LIMITED = "rate_limited"  # one message refused by the proxy's bounds; the session goes on
    # an interaction the shared session store could not keep (a stall, a full or lost store): not
    # applied, never acked; retryable with the same event_id; the session and its video go on
    STORE_UNAVAILABLE = "store_unavailable"
    SERVER_SHUTDOWN = "server_shutdown"
    # a session.resume refused: wrong, expired or used token, another replica's session, or an
    # index outside the replay buffer; the connection closes, the session (if any) is untouched
    INVALID_RESUME = "invalid_resume"
    # vLLM-Omni 0.32's names (docs/protocol.md §3): one interaction refused because the session
    # already holds MAX_PENDING_EVENTS waiting for a chunk boundary (0.32: 64); the session goes on
    INTERACTION_QUEUE_FULL = "interaction_queue_full"
    # one interaction refused because the session has admitted its limit of distinct event ids
    # (`event_book.MAX_EVENTS_PER_SESSION`); a new session takes more
    INTERACTION_HISTORY_FULL = "interaction_history_full"
    # 0.32: the server's queue of control answers (acks, pongs, errors) is full; never sent here
    # (a client that does not read gets slow_consumer: docs/protocol.md §7)
    CONTROL_QUEUE_FULL = "control_queue_full"


#: Codes after which the session is over (followed by `session.done` where possible).
SESSION_ENDING_CODES = frozenset(
    {
        ErrorCode.START_TIMEOUT,
        ErrorCode.INVALID_START,
        ErrorCode.UNSUPPORTED_FORMAT,
        ErrorCode.MODEL_MISMATCH,
        ErrorCode.STALL_TIMEOUT,
        ErrorCode.IDLE_TIMEOUT,
        ErrorCode.SERVER_BUSY,
        ErrorCode.GENERATION_FAILED,
        ErrorCode.BACKEND_UNAVAILABLE,
        ErrorCode.SLOW_CONSUMER,
        ErrorCode.SERVER_SHUTDOWN,
    }
)


@dataclass
class ProtocolError(Exception):
    """A rejected message: carries the wire code and a sentence a person understands."""

    code: ErrorCode
    message: str
    event_id: str | None = None

    def __str__(self) -> str:
        return f"{self.code.value}: {self.message}"
