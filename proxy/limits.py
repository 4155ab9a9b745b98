"""Small bounds a proxy session keeps (docs/protocol.md §7), and what it reads of a frame it
refuses under them. Pure (time passed in), so that each can be tested alone:

- `TokenBucket`: the client's message rate;
- `RecentIds`: an insertion-ordered set of event ids that forgets its oldest entries;
- `over_rate_stop`, `refused_event_id`: a frame over the rate is not processed, but a
  `session.stop` still passes, and a `session.interaction`'s `rate_limited` answer names its
  `event_id`; each is read only when that is cheap and safe (a bounded text frame that parses).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rtvideo.core import fields, protocol
from rtvideo.core.errors import ProtocolError
from rtvideo.core.event_book import MAX_EVENTS_PER_SESSION

#: a frame over the rate this small is parsed anyway, so that a session.stop is never refused
STOP_PEEK_BYTES = 256
_EVENT_ID_KEY = '"event_id"'


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


def over_rate_stop(raw: str | bytes, binary: bool) -> bool:
    """Whether a frame over the rate is a `session.stop` anyway (looked at only when small)."""
    if binary or len(raw) > STOP_PEEK_BYTES:
        return False
    return _contains(raw, protocol.STOP) and protocol.is_stop(raw)


def event_id_in(message: Mapping[str, Any]) -> str | None:
    """The `interaction.event_id` of a decoded `session.interaction`, when it is one a server
    message may carry (a string of 1 to `MAX_EVENT_ID_CHARS` characters); else None."""
    if message.get("type") != protocol.INTERACTION:
        return None
    interaction = message.get("interaction")
    event_id = interaction.get("event_id") if isinstance(interaction, dict) else None
    if isinstance(event_id, str) and 0 < len(event_id) <= fields.MAX_EVENT_ID_CHARS:
        return event_id
    return None


def refused_event_id(raw: str | bytes, binary: bool) -> str | None:
    """The event id a frame refused unprocessed (over the rate) names, for its `rate_limited`
    answer: only a text frame within the message limit that names `"event_id"`, parses, and
    is a `session.interaction` with a usable one (`event_id_in`); anything else, None."""
    if binary or len(raw) > protocol.MAX_MESSAGE_BYTES:
        return None
    if not _contains(raw, _EVENT_ID_KEY):  # cheap, before any parse
        return None
    try:
        message = protocol.decode_later(raw)
    except ProtocolError:
        return None
    return event_id_in(message)


def _contains(raw: str | bytes, text: str) -> bool:
    return text in raw if isinstance(raw, str) else text.encode() in raw
