"""The error a `RealtimeVideoClient` raises or hands to its `on_error` (docs/protocol.md §5)."""

from __future__ import annotations

from typing import Any

__all__ = ["RealtimeVideoError"]


class RealtimeVideoError(Exception):
    """An `error` message: `code` is the stable code, `event_id` set when it concerns one event."""

    def __init__(self, code: str, message: str, event_id: str | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code, self.message, self.event_id = code, message, event_id

    @classmethod
    def from_message(cls, m: dict[str, Any]) -> RealtimeVideoError:
        return cls(str(m.get("code")), str(m.get("message", "")), m.get("event_id"))
