"""In-band metrics: `session.metrics` for an owner whose `session.start` asked with
`"metrics": true` (docs/protocol.md §3.5).

The proxy makes them because it sees both ends: the model's per-chunk `timing` (which the
model adds to each media chunk's metadata for such a start), when each chunk reached the proxy
and when the owner's socket took it, and the player's reports. One goes out after a media
chunk pair was handed to the owner, at most once every `INTERVAL_SECONDS`, through the
session's dispatch like any answer of the proxy's own: ordered with the chunk stream (never
between a chunk's metadata and its payload) and written to the owner alone (watchers take
chunk pairs and the done only). A start that did not ask gets nothing of this.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from rtvideo.core import protocol
from rtvideo.core.event_book import Outcome
from rtvideo.core.start_request import METRICS

#: at most one session.metrics per this many seconds
INTERVAL_SECONDS = 1.0
#: chunks whose arrival time is kept until the socket takes them (more waiting is slow_consumer's)
MAX_IN_FLIGHT = 256

#: writes an answer of the proxy's own to the owner (the session's `Dispatch.answer`)
Answer = Callable[[Callable[[], Mapping[str, Any]]], None]


class Named(Protocol):
    """The session's phase, as the figures read it (rtvideo.proxy.phase's `SessionPhase`)."""

    @property
    def request_id(self) -> str | None: ...


class Buffered(Protocol):
    """The session's playhead timing (rtvideo.proxy.observability.session_timing's `PlayheadTiming`)."""

    @property
    def buffered_seconds(self) -> float | None:
        """The player's buffer from its latest report."""


class Unapplied(Protocol):
    """The session's event book, read-only (rtvideo.proxy.session.ledger's `BookView`)."""

    def outcome(self, *, acked_only: bool = False) -> Outcome:
        """The events with no visible end yet: its `unapplied` are those no chunk has started."""
        ...


class InbandMetrics:
    """One session's `session.metrics`; inert until `asked()` sees `"metrics": true`."""

    def __init__(
        self,
        answer: Answer,
        life: Named,
        playhead: Buffered,
        book: Unapplied,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._answer = answer
        self._life = life
        self._playhead = playhead
        self._book = book
        self._clock = clock
        self._on = False
        self._arrived: dict[int, float] = {}  # transport index → when the chunk reached the proxy
        self._last_sent: float | None = None
        self._scheduled = False
        self._latest: dict[str, Any] | None = None  # the figures of the last media chunk handed out

    @property
    def on(self) -> bool:
        return self._on

    def asked(self, start: Mapping[str, Any]) -> None:
        """The session's start: on when it says `"metrics": true` (anything else but a
        boolean is the model's `invalid_start`, and then no chunk ever comes)."""
        self._on = start.get(METRICS) is True

    def arrived(self, message: Mapping[str, Any] | None) -> None:
        """A reply from the model, as it reaches the proxy."""
        if not self._on or message is None or message.get("type") != protocol.CHUNK_METADATA:
            return
        index = message.get("transport_chunk_index")
        if isinstance(index, int) and len(self._arrived) < MAX_IN_FLIGHT:
            self._arrived[index] = self._clock()

    def taken(self, message: Mapping[str, Any] | None) -> None:
        """A message the owner's socket took; after a media chunk pair a `session.metrics` is
        due when the last one is `INTERVAL_SECONDS` old."""
        if not self._on or message is None or message.get("type") != protocol.CHUNK_METADATA:
            return
        now = self._clock()
        index = message.get("transport_chunk_index")
        arrived = self._arrived.pop(index, None) if isinstance(index, int) else None
        if message.get("kind") != "media" or not isinstance(index, int):
            return
        timing = message.get("timing") or {}
        self._latest = {
            "transport_chunk_index": index,
            "generation_chunk_index": message.get("generation_chunk_index"),
            "generate_seconds": timing.get("generate_seconds"),
            "encode_seconds": timing.get("encode_seconds"),
            "realtime_factor": timing.get("realtime_factor"),
            "delivery_seconds": round(max(0.0, now - arrived), 4) if arrived is not None else 0.0,
        }
        due = self._last_sent is None or now - self._last_sent >= INTERVAL_SECONDS
        if due and not self._scheduled:
            # after the socket's take returns: the answer is queued behind the pair, not inside it
            self._scheduled = True
            self._last_sent = now
            asyncio.get_running_loop().call_soon(self._send)

    def _send(self) -> None:
        self._scheduled = False
        if self._latest is not None:
            self._answer(self.message)

    def message(self) -> dict[str, Any]:
        """The `session.metrics` of the last media chunk handed out (built when it is written)."""
        buffered = self._playhead.buffered_seconds
        return {
            "type": protocol.METRICS,
            "request_id": self._life.request_id,
            **(self._latest or {}),
            "buffered_seconds": None if buffered is None else round(buffered, 3),
            "queued_events": len(self._book.outcome(acked_only=True).unapplied),  # acked, no chunk started yet
        }
