"""Small bounds a proxy session keeps (docs/protocol.md §7): a token bucket for the client's
message rate and an insertion-ordered set of event ids that forgets its oldest entries.
Pure (time passed in), so that each can be tested alone."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from rtvideo.core.idempotency import MAX_EVENTS_PER_SESSION


@dataclass
class TokenBucket:
    """`rate` tokens a second, at most `burst` saved up; each message takes one."""

    rate: float
    burst: float
    now: float
    tokens: float = field(init=False)

    def __post_init__(self) -> None:
        self.tokens = self.burst

    def take(self, now: float) -> bool:
        """One token, if there is one (False: the message is over the rate)."""
        self.tokens = min(self.burst, self.tokens + max(0.0, now - self.now) * self.rate)
        self.now = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


class RecentIds:
    """A set of event ids that keeps at most `limit`, forgetting the oldest first.

    The default is the model's own bound: it admits at most `MAX_EVENTS_PER_SESSION`
    distinct event ids per session (its next new id is refused before any ack), and only
    acked ids enter these sets, so with the shipped model nothing is ever forgotten; the
    bound only keeps a session's memory finite whatever the model behind the proxy does.
    """

    def __init__(self, ids: Iterable[str] = (), limit: int = MAX_EVENTS_PER_SESSION) -> None:
        self.limit = limit
        self._ids: dict[str, None] = {}
        for event_id in ids:
            self.add(event_id)

    def add(self, event_id: str) -> None:
        if event_id in self._ids:
            return
        self._ids[event_id] = None
        if len(self._ids) > self.limit:
            del self._ids[next(iter(self._ids))]

    def __contains__(self, event_id: object) -> bool:
        return event_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def issuperset(self, event_ids: Iterable[str]) -> bool:
        return all(event_id in self._ids for event_id in event_ids)
