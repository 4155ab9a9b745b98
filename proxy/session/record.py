"""What another process needs to continue one session: its `SessionRecord`.

One typed record, built by the session from its parts on demand (`ProxySession.record`), so
that a session store (docs/operations.md "When a proxy dies") keeps exactly this and nothing
that lives only in one proxy's memory: the start that continues it at the next chunk (the
original start with its seed pinned and its events as a rebuild, or the approximation of an
engine's session), where its owner is (the last transport chunk handed out), the hashes of the
tokens that attach participants (never the tokens), and its recording. Pure data.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


def token_hash(token: str) -> str:
    """A token as a record keeps it: its SHA-256, hex."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def delivered_fields(message: Mapping[str, Any], size: int) -> tuple[dict[str, str], dict[str, str]]:
    """What a chunk handed to the owner adds to the stored session: where it stands (the
    transport index, with this chunk's generation index, frames and bytes, kept per index so a
    replica can continue after any chunk a client got) and where events started in it."""
    index = message.get("transport_chunk_index")
    where = [message.get("kind"), message.get("generation_chunk_index"), message.get("num_frames"), size]
    fields = {"delivered": str(index), f"chunk:{index}": json.dumps(where)}
    offsets = message.get("event_frame_offsets") or {}
    generation = message.get("generation_chunk_index")
    started = {e: f"{generation},{int(offsets.get(e, 0))}" for e in message.get("started_event_ids") or ()}
    return fields, started


@dataclass(frozen=True)
class SessionRecord:
    """One session as another process would continue it."""

    request_id: str
    #: the `session.start` that continues it at `next_generation_chunk` (seed pinned, events
    #: as a rebuild, or the approximation for an engine), or None while it cannot be moved
    continuation: Mapping[str, Any] | None
    next_generation_chunk: int
    next_transport_chunk: int  # the transport index the next chunk handed out carries
    delivered: int | None  # the last transport chunk index the owner's socket took
    #: "resume", "watch", "steer", "recording" → `token_hash` of the live token of that kind
    token_hashes: Mapping[str, str] = field(default_factory=dict)
    recording_id: str | None = None
    why_not_movable: str | None = None  # set when `continuation` is None
