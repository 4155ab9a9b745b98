"""The "ack before mention" guard (docs/protocol.md §7).

Triton may interleave the responses of different requests on one gRPC stream, so a
chunk that names an event can overtake that event's ack (which travels on the
interaction request's own response stream). The gate holds back start-stream
messages that name an event whose ack has not been forwarded yet, in order, until
the ack passes; every named event was admitted, so its ack is on its way.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, Generic, Mapping, TypeVar

from rtvideo.core import protocol
from rtvideo.core.chunks import mentioned_event_ids

T = TypeVar("T")


def named_event_ids(message: Mapping[str, Any]) -> set[str]:
    """Event ids a start-stream message refers to (each was acked on another stream)."""
    kind = message.get("type")
    if kind == protocol.CHUNK_METADATA:
        return mentioned_event_ids(dict(message))
    if kind == protocol.ERROR and message.get("event_id"):
        return {message["event_id"]}  # interaction_failed: decided after the ack
    if kind == protocol.DONE:
        return set(message.get("unapplied_event_ids") or ()) | set(message.get("unfinished_event_ids") or ())
    return set()


class AckGate(Generic[T]):
    """Per-session ordering state; pure, the session applies the time bound."""

    def __init__(self) -> None:
        self._acked: set[str] = set()
        self._held: deque[tuple[T, set[str]]] = deque()
        self.held_since: float | None = None  # monotonic time the oldest held item arrived

    def admit(self, item: T, names: set[str]) -> list[T]:
        """A start-stream item: the items to forward now (it, or nothing while held)."""
        if not self._held and names <= self._acked:
            return [item]
        if not self._held:
            self.held_since = time.monotonic()
        self._held.append((item, names))
        return []

    def ack(self, event_id: str) -> list[T]:
        """An ack was forwarded: the held items that may follow it now, in order."""
        self._acked.add(event_id)
        released: list[T] = []
        while self._held and self._held[0][1] <= self._acked:
            released.append(self._held.popleft()[0])
        self.held_since = time.monotonic() if self._held else None
        return released

    def release_all(self) -> list[T]:
        """Give up waiting (the bound expired, or the session ends): everything held, in order."""
        released = [item for item, _ in self._held]
        self._held.clear()
        self.held_since = None
        return released
