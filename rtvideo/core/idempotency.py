"""Per-session event-id registry: retry versus conflict by payload fingerprint (docs/protocol.md §4)."""

from __future__ import annotations

from dataclasses import dataclass, field

from rtvideo.core.errors import ErrorCode, ProtocolError

#: distinct event ids one session may admit: ~3 new events a second for the longest session
MAX_EVENTS_PER_SESSION = 10_000


@dataclass
class IdempotencyRegistry:
    """Remembers every admitted event id with its fingerprint (a fixed-size digest) for the life
    of the session. Bounded: at most `max_events` ids, each at most `MAX_EVENT_ID_CHARS`."""

    max_events: int = MAX_EVENTS_PER_SESSION
    _seen: dict[str, bytes] = field(default_factory=dict)

    def admit(self, event_id: str, fingerprint: bytes) -> bool:
        """True: a new event, now recorded. False: a retry, to be acked again and not applied.

        Raises `event_id_conflict` when the id was admitted with another payload; the
        original stays as it was. Callers record only messages that passed validation.
        """
        known = self._seen.get(event_id)
        if known is None:
            if len(self._seen) >= self.max_events:
                raise ProtocolError(
                    ErrorCode.INVALID_INTERACTION,
                    f"this session has reached its limit of {self.max_events} interactions",
                    event_id,
                )
            self._seen[event_id] = fingerprint
            return True
        if known == fingerprint:
            return False
        raise ProtocolError(
            ErrorCode.EVENT_ID_CONFLICT,
            f"event_id {event_id!r} was already used with a different payload",
            event_id,
        )

    def __len__(self) -> int:
        return len(self._seen)
