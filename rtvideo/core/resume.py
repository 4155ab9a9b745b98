"""`session.resume`: the proxy's first message that takes over a detached session (docs/protocol.md §9).

Apart from the client messages Triton sees (`rtvideo.core.protocol`) because only the proxy
reads it, before any session exists. `ResumeRefused` is why a resume (or any attach by a
token) is refused: the proxy answers it with `invalid_resume`, here or at the replica that
takes the session over.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from rtvideo.core.errors import ErrorCode, ProtocolError
from rtvideo.core.fields import as_int
from rtvideo.core.protocol import MAX_MESSAGE_BYTES, MAX_NUM_FRAMES, decode_object_any

#: the first message of a connection that takes over a detached session; the proxy answers it
#: itself (it is not a Triton request, so it is not one of CLIENT_TYPES)
RESUME = "session.resume"
#: a resume token's length bound, in characters (a proxy's tokens are far shorter)
MAX_RESUME_TOKEN_CHARS = 256


@dataclass(frozen=True)
class ResumeRequest:
    """`session.resume`: the token from the last `video.start`, and the transport index of the
    last payload the client fully received (-1: none)."""

    resume_token: str
    last_transport_chunk_index: int


def is_resume(raw: bytes | str, *, binary: bool = False) -> bool:
    """Whether a first message is a `session.resume` (cheap: any JSON object of that type)."""
    if binary:
        return False
    if (RESUME not in raw) if isinstance(raw, str) else (RESUME.encode() not in raw):
        return False  # most first messages are starts: no second parse of a large one
    try:
        obj = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return False
    return isinstance(obj, dict) and obj.get("type") == RESUME


def parse_resume(raw: bytes | str) -> ResumeRequest:
    """Validate a `session.resume`; every failure is `invalid_resume`."""
    bad = ErrorCode.INVALID_RESUME
    try:
        obj = decode_object_any(raw, MAX_MESSAGE_BYTES)
    except ProtocolError as exc:
        raise ProtocolError(bad, f"session.resume: {exc.message}") from None
    unknown = sorted(set(obj) - {"type", "resume_token", "last_transport_chunk_index"})
    if unknown:
        raise ProtocolError(bad, f"unknown session.resume field(s): {', '.join(unknown)}")
    token = obj.get("resume_token")
    if not isinstance(token, str) or not token or len(token) > MAX_RESUME_TOKEN_CHARS:
        raise ProtocolError(
            bad, f"resume_token must be a non-empty string of at most {MAX_RESUME_TOKEN_CHARS} characters"
        )
    last = as_int(obj.get("last_transport_chunk_index"), "last_transport_chunk_index", -1, MAX_NUM_FRAMES, bad)
    return ResumeRequest(token, last)


class ResumeRefused(Exception):
    """Why a token, or the attach it asks for, is refused (`invalid_resume` for a resume);
    `oldest`: the smallest `last_transport_chunk_index` the session can resume from, when
    that is the reason."""

    def __init__(self, message: str, oldest: int | None = None, *, unknown: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.oldest = oldest
        self.unknown = unknown  # a well-formed token of this instance that this replica never saw
