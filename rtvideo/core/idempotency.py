"""Per-session event-id registry: retry versus conflict by payload fingerprint (docs/protocol.md §4)."""

from __future__ import annotations

from dataclasses import dataclass, field

from rtvideo.core.errors import ErrorCode, ProtocolError


@dataclass
class IdempotencyRegistry:
    """Remembers every admitted event id with its fingerprint for the life of the session."""

    max_events: int = 100_000
    _seen: dict[str, str] = field(default_factory=dict)

    def admit(self, event_id: str, fingerprint: str) -> bool:
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
