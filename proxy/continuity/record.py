"""What another process needs to continue one session, as the session store keeps it: its
`SavedSession`.

The session writes its parts as they happen (rtvideo.proxy.continuity.writer); a replica that
takes it over (docs/operations.md "When a proxy dies") reads them back as one typed record:
the start as sent to the model, the `video.start` as handed out (its seed), the options its
start asked for, the stream's init segment, the hashes of its tokens (never the tokens), and
its log in order: each interaction as forwarded and each frame its owner took, with the
payloads of the last chunks. From these the move machinery rebuilds the start that goes on at
the next chunk (exactly, or the approximation of an engine's session). Pure data.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass
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
    (rtvideo.proxy.continuity.takeover): its start, what its owner was handed, in order."""

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
    recording_id: str | None = None  # its recording (rtvideo.proxy.recordings), which goes on with it
    broadcast_id: str | None = None  # its broadcast (rtvideo.proxy.broadcasts), which goes on with it

    def acked(self) -> list[str]:
        """The events whose ack the owner was handed."""
        frames = (e.message for e in self.log if isinstance(e, SavedFrame))
        return [
            m["event_id"] for m in frames if m.get("type") == protocol.QUEUED and isinstance(m.get("event_id"), str)
        ]

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
            recording_id=fields.get("recording_id") or None,
            broadcast_id=fields.get("broadcast_id") or None,
        )
