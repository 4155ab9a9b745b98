"""Server messages: the builders of what the model and the proxy send (docs/protocol.md §3).

Apart from client-message parsing (`rtvideo.core.protocol`) because both sides only build
these; their `type` names stay with the others in the envelope module.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import Any

from rtvideo.core.errors import ErrorCode, ProtocolError
from rtvideo.core.protocol import (
    BROADCAST_ENDED,
    DONE,
    ERROR,
    INTERACTION_SHARED,
    PONG,
    QUEUED,
    STEERING_REVOKED,
    VIDEO_START,
)


def encode(message: Mapping[str, Any]) -> str:
    """Compact JSON for the wire."""
    return json.dumps(message, separators=(",", ":"), ensure_ascii=False)


def new_request_id() -> str:
    return f"video_stream-{uuid.uuid4().hex}"


def video_start(request_id: str, fmt: str, config: Mapping[str, Any]) -> dict[str, Any]:
    return {"type": VIDEO_START, "request_id": request_id, "format": fmt, "config": dict(config)}


def queued(request_id: str | None, event_id: str, received_at: float | None = None) -> dict[str, Any]:
    """The ack; `received_at` (vLLM-Omni 0.32, on a paced session's acks): when the server received
    the interaction, in wall-clock UNIX seconds (docs/protocol.md §3.1)."""
    ack: dict[str, Any] = {"type": QUEUED, "request_id": request_id, "event_id": event_id}
    if received_at is not None:
        ack["received_at"] = round(received_at, 6)
    return ack


def pong() -> dict[str, Any]:
    return {"type": PONG}


def broadcast_ended(request_id: str | None, url: str) -> dict[str, Any]:
    """The answer to `session.broadcast` {"enabled": false}: the playlist has ended."""
    return {"type": BROADCAST_ENDED, "request_id": request_id, "broadcast_url": url}


def steering_revoked(request_id: str | None, revoked: int) -> dict[str, Any]:
    """The answer to `session.revoke_steering`: how many steer links were ended."""
    return {"type": STEERING_REVOKED, "request_id": request_id, "revoked": revoked}


def interaction_shared(
    request_id: str | None, event_id: str, sender: str, interaction: Mapping[str, Any]
) -> dict[str, Any]:
    """What the other participants of a shared session are told of an interaction acked to its
    sender (`sender`: "owner" or "steerer"): its id and what it asked, as the sender sent it."""
    return {
        "type": INTERACTION_SHARED,
        "request_id": request_id,
        "event_id": event_id,
        "from": sender,
        "interaction": {**interaction, "event_id": event_id},
    }


def done(
    request_id: str | None,
    *,
    chunks: int,
    stopped: bool,
    unapplied_event_ids: list[str],
    unfinished_event_ids: list[str],
) -> dict[str, Any]:
    return {
        "type": DONE,
        "request_id": request_id,
        "chunks": chunks,
        "stopped": stopped,
        "unapplied_event_ids": list(unapplied_event_ids),
        "unfinished_event_ids": list(unfinished_event_ids),
    }


def error(
    code: ErrorCode, message: str, *, request_id: str | None = None, event_id: str | None = None
) -> dict[str, Any]:
    out: dict[str, Any] = {"type": ERROR, "code": code.value, "message": message}
    if request_id is not None:
        out["request_id"] = request_id
    if event_id is not None:
        out["event_id"] = event_id
    return out


def error_from(exc: ProtocolError, request_id: str | None = None) -> dict[str, Any]:
    return error(exc.code, exc.message, request_id=request_id, event_id=exc.event_id)
