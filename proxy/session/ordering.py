"""The order of what goes to a session's owner (`OutboundOrder`).

Triton may interleave the responses of different requests on one gRPC stream, so the proxy
keeps two rules: nothing precedes `video.start` (an answer to a later request that overtook it
waits behind it); no message names an event before its ack (a start-stream message naming an
event whose ack has not been written waits, in order, until the ack passes: it is on its way,
the event was admitted; still, each waits at most `ack_wait` seconds from its own arrival).
Answers may overtake queued video (they are small and a client waits for them), but only once
`video.start` was handed to the socket: until then the writer could put them ahead of it.

Pure (no I/O, no asyncio, time passed in) so that it can be tested alone; the session
writes what each call returns and arms one timer for `deadline`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from rtvideo.core import protocol
from rtvideo.core.chunks import mentioned_event_ids
from rtvideo.proxy.limits import RecentIds

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


@dataclass(frozen=True)
class Send(Generic[T]):
    """One item to write now; `urgent`: it may overtake queued video."""

    item: T
    urgent: bool = False


@dataclass(frozen=True)
class _Held(Generic[T]):
    """A start-stream message waiting for acks (or for the one ahead of it)."""

    item: T
    names: frozenset[str]
    arrived: float
    opens: bool  # it is video.start


@dataclass(frozen=True)
class _Early(Generic[T]):
    """An answer that came before video.start."""

    item: T
    size: int
    ack: str | None


@dataclass
class OutboundOrder(Generic[T]):
    """One session's ordering state: feed it every message, write what it returns, in order."""

    #: the longest a start-stream message waits for the acks it names, from its own arrival
    ack_wait: float
    #: bytes of answers waiting for video.start (the session bounds them like its outbound buffer)
    early_bytes: int = field(default=0, init=False)
    _started: bool = field(default=False, init=False)  # video.start was returned
    _start_taken: bool = field(default=False, init=False)  # ... and handed to the socket
    _early: list[_Early[T]] = field(default_factory=list, init=False)
    _acked: RecentIds = field(default_factory=RecentIds, init=False)  # bounded: see RecentIds
    _held: deque[_Held[T]] = field(default_factory=deque, init=False)  # in arrival order
    _overdue: int = field(default=0, init=False)  # held messages at the front that go regardless of acks

    @property
    def acked(self) -> RecentIds:
        """The events whose ack was handed out (the most recent, bounded)."""
        return self._acked

    def stream(self, item: T, message: Mapping[str, Any], now: float) -> list[Send[T]]:
        """A message on the start request's stream (video.start, chunks, session.done, ...)."""
        names = frozenset(named_event_ids(message))
        self._held.append(_Held(item, names, now, opens=message.get("type") == protocol.VIDEO_START))
        return self._flow()

    def answer(self, item: T, size: int, ack: str | None = None) -> list[Send[T]]:
        """The answer to one later request; `ack`: the event id it acknowledges (`queued`)."""
        if not self._started:
            self._early.append(_Early(item, size, ack))
            self.early_bytes += size
            return []
        return self._answered(item, ack)

    def handed_out(self, message: Mapping[str, Any]) -> None:
        """The writer handed this message to the socket."""
        if message.get("type") == protocol.VIDEO_START:
            self._start_taken = True

    def taken_over(self, acked: Iterable[str]) -> None:
        """A session taken over from another replica: its video.start and the acks of `acked`
        were handed out there (the new stream's own video.start never reaches the client)."""
        self._started = self._start_taken = True
        for event_id in acked:
            self._acked.add(event_id)

    @property
    def deadline(self) -> float | None:
        """When the oldest held message stops waiting for its acks (None: nothing held)."""
        return min(h.arrived for h in self._held) + self.ack_wait if self._held else None

    def expire(self, now: float) -> list[Send[T]]:
        """Held messages whose wait is over go now, with everything ahead of them (order is
        kept) and whatever behind them was waiting only for them."""
        due = [i for i, held in enumerate(self._held) if held.arrived + self.ack_wait <= now]
        if not due:
            return []
        self._overdue = due[-1] + 1
        return self._flow()

    def _flow(self) -> list[Send[T]]:
        """The held messages that may go now, from the front, in order."""
        sends: list[Send[T]] = []
        while self._held and (self._overdue or self._acked.issuperset(self._held[0].names)):
            self._overdue = max(0, self._overdue - 1)
            held = self._held.popleft()
            sends.append(Send(held.item))
            if held.opens and not self._started:
                sends += self._start()
        return sends

    def _start(self) -> list[Send[T]]:
        """video.start goes: the answers that waited for it follow, in arrival order."""
        self._started = True
        early, self._early, self.early_bytes = self._early, [], 0
        sends: list[Send[T]] = []
        for answer in early:
            sends += self._answered(answer.item, answer.ack)
        return sends

    def _answered(self, item: T, ack: str | None) -> list[Send[T]]:
        sends = [Send(item, urgent=self._start_taken)]
        if ack is not None:
            self._acked.add(ack)
            sends += self._flow()
        return sends
