"""What a client has been sent, so that a `session.done` the proxy writes itself (slow
consumer, backend failure) still gives every acked event exactly one visible end."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rtvideo.core import protocol
from rtvideo.core.errors import ErrorCode
from rtvideo.proxy.limits import RecentIds


@dataclass
class Ledger:
    request_id: str | None = None
    chunks: int = 0
    unapplied: dict[str, None] = field(default_factory=dict)  # acked, not started (insertion-ordered)
    unfinished: dict[str, None] = field(default_factory=dict)  # started, not completed
    ended: RecentIds = field(default_factory=RecentIds)  # bounded like the model's event ids (RecentIds)

    def observe(self, message: Mapping[str, Any] | None, has_data: bool) -> None:
        """One frame (or pair) handed to the socket, in order."""
        self.chunks += has_data
        if message is None:
            return
        kind = message.get("type")
        if kind == protocol.VIDEO_START:
            self.request_id = message.get("request_id")
        elif kind == protocol.QUEUED and message["event_id"] not in self.ended:
            if message["event_id"] not in self.unfinished:
                self.unapplied.setdefault(message["event_id"], None)
        elif kind == protocol.ERROR and message.get("code") == ErrorCode.INTERACTION_FAILED.value:
            self._end(message.get("event_id"))
        elif kind == protocol.CHUNK_METADATA:
            for event_id in message.get("started_event_ids", ()):
                self.unapplied.pop(event_id, None)
                self.unfinished.setdefault(event_id, None)
            for key in ("completed_event_ids", "interrupted_event_ids", "superseded_event_ids"):
                for event_id in message.get(key, ()):
                    self._end(event_id)

    def _end(self, event_id: str | None) -> None:
        if event_id is not None:
            self.ended.add(event_id)
            self.unapplied.pop(event_id, None)
            self.unfinished.pop(event_id, None)

    def done(self) -> dict[str, Any]:
        """The `session.done` for an end the model did not report itself."""
        return protocol.done(
            self.request_id,
            chunks=self.chunks,
            stopped=False,
            unapplied_event_ids=list(self.unapplied),
            unfinished_event_ids=list(self.unfinished),
        )
