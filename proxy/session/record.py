"""What another process needs to continue one session: its `SessionRecord`.

One typed record, built by the session from its parts on demand (`ProxySession.record`), so
that a session store (docs/operations.md "When a proxy dies") keeps exactly this and nothing
that lives only in one proxy's memory: the start that continues it at the next chunk (the
original start with its seed pinned and its events as a rebuild, or the approximation of an
engine's session), where its owner is (the last transport chunk handed out), the hashes of the
tokens that attach participants (never the tokens), and its recording. Pure data.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rtvideo.core import protocol
from rtvideo.proxy.store.base import EVENT, FRAME, StoredSession


def token_hash(token: str) -> str:
    """A token as a record keeps it: its SHA-256, hex."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True)
class SavedEvent:
    """An interaction as it was forwarded to the model (its id filled in), before its ack left."""

    raw: bytes


@dataclass(frozen=True)
class SavedFrame:
    """A frame the owner's socket took: its text, and a pair's transport index and payload
    (None once the store forgot it: only the last chunks' payloads are kept)."""

    text: str
    message: dict[str, Any]
    index: int | None = None
    data: bytes | None = None


@dataclass(frozen=True)
class SavedSession:
    """A session as the store keeps it, read back by the replica that takes it over
    (rtvideo.proxy.store.takeover): its start, what its owner was handed, in order."""

    sid: str
    request_id: str
    start: bytes  # as sent to the model
    handed_start: dict[str, Any]  # video.start as handed out, without tokens
    options: dict[str, bool]  # what its start asked of the proxy (resumable, watchable, …)
    init: bytes | None  # the stream's init segment (None before its first payload)
    log: tuple[SavedEvent | SavedFrame, ...]
    age: float  # seconds since its holder last renewed its lease
    detached_at: float | None  # unix time its owner's link dropped, if it is away
    token_hashes: dict[str, str]  # its live tokens by kind ("resume", "watch", …), hashed

    @classmethod
    def read(cls, stored: StoredSession) -> SavedSession:
        """ValueError when the store holds no session that can be continued (not started)."""
        fields = stored.fields
        if "handed_start" not in fields or "start" not in fields:
            raise ValueError("the session had not started when its proxy went")
        log: list[SavedEvent | SavedFrame] = []
        for entry in stored.log:
            kind, text = entry[:1], entry[1:]
            if kind == EVENT:
                log.append(SavedEvent(text.encode("utf-8", "surrogatepass")))
            elif kind == FRAME:
                message = json.loads(text)
                index = message.get("transport_chunk_index") if message.get("type") == protocol.CHUNK_METADATA else None
                data = stored.payloads.get(index) if isinstance(index, int) else None
                log.append(SavedFrame(text, message, index if isinstance(index, int) else None, data))
        init = fields.get("init")
        detached = fields.get("detached_at")
        return cls(
            sid=stored.sid,
            request_id=fields["request_id"],
            start=fields["start"].encode("utf-8", "surrogatepass"),
            handed_start=json.loads(fields["handed_start"]),
            options=json.loads(fields.get("options") or "{}"),
            init=base64.b64decode(init) if init else None,
            log=tuple(log),
            age=stored.age,
            detached_at=float(detached) if detached else None,
            token_hashes=json.loads(fields.get("tokens") or "{}"),
        )


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
