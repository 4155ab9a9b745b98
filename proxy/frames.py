"""The unit every participant's outbox writes: a `Frame` (a text frame, or a metadata text frame
with the binary payload that follows it), and the `Sink` it is written to (what Tornado's
`WebSocketHandler` offers for writing).

A base module of the proxy: the session, its participants, recordings, broadcasts and the
continuity of a session taken over all pass frames, so none of them owns the type. Pure data.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol


class Sink(Protocol):
    """What Tornado's `WebSocketHandler` offers for writing."""

    def write_message(self, message: str | bytes, binary: bool = False) -> Awaitable[None]: ...


@dataclass(frozen=True)
class Frame:
    """A text frame (`message` is its parsed form), or a metadata text frame with the binary
    payload that follows it."""

    text: str
    message: Mapping[str, Any] = field(compare=False)
    data: bytes | None = None
    size: int = field(init=False)  # bytes on the wire (payloads), for the buffer bound and metrics
    #: a frame sent again on a resumed connection (or a watcher's own): the session's ledger and
    #: timing saw it the first time (or never concern it), so `on_taken` passes it through
    replay: bool = field(default=False, compare=False)

    def __post_init__(self) -> None:
        size = len(self.text.encode("utf-8")) + (len(self.data) if self.data is not None else 0)
        object.__setattr__(self, "size", size)
