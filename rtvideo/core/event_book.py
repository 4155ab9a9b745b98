"""One session's interaction events, from admission to their one visible end (docs/protocol.md §4, §5).

The single owner of an event's lifecycle and of `session.done`'s two lists. The model's
session keeps one book (fed with what it admits, acks, sends and fails); the proxy keeps
another for the same session (fed with what it acks and what it hands to the client's
socket), so both answer with the same rule:

- `unapplied_event_ids`: acked (or admitted) events that no chunk started and that did not
  fail, in admission order;
- `unfinished_event_ids`: events a chunk started that no chunk completed, interrupted or
  superseded.

Invariant: every admitted event is in exactly one state; an ended event never changes
again. Admission applies the idempotency rule (a retry is acked again and not applied; the
same id with another payload is `event_id_conflict`) and the session's event bound.

Pure: no I/O, no clocks, no threads (callers hold their own lock).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rtvideo.core import protocol, server_messages
from rtvideo.core.errors import ErrorCode, ProtocolError

#: distinct event ids one session may admit: ~3 new events a second for the longest session
#: (beyond it: `interaction_history_full`, as vLLM-Omni 0.32 names its own bound of 4096)
MAX_EVENTS_PER_SESSION = 10_000
#: events admitted and not yet started, superseded or failed that one session may hold
#: (beyond it: `interaction_queue_full`, vLLM-Omni 0.32's bound of 64 pending interactions)
MAX_PENDING_EVENTS = 64


class EventState(enum.Enum):
    """Where an event is in its lifecycle; the last four are ends."""

    ADMITTED = "admitted"  # recorded, its ack not (yet) delivered
    ACKED = "acked"  # the client was told it is queued
    STARTED = "started"  # a chunk listed it in started_event_ids
    COMPLETED = "completed"
    INTERRUPTED = "interrupted"
    SUPERSEDED = "superseded"
    FAILED = "failed"  # interaction_failed

    @property
    def ended(self) -> bool:
        return self in _ENDS


_ENDS = frozenset({EventState.COMPLETED, EventState.INTERRUPTED, EventState.SUPERSEDED, EventState.FAILED})
_WAITING = frozenset({EventState.ADMITTED, EventState.ACKED})


@dataclass(frozen=True)
class Outcome:
    """Events that reached no visible end on a chunk before the stream ended."""

    unapplied: tuple[str, ...]
    unfinished: tuple[str, ...]


class UnknownPayload(LookupError):
    """The book knows the id only from an ack it observed, not the payload: it cannot tell a
    retry from a conflict (whoever admitted it must answer)."""


@dataclass(slots=True)
class _Entry:  # one per event for the session's life: kept small (a 32-byte digest, no payload)
    fingerprint: bytes | None
    state: EventState


class EventBook:
    """The events of one session, in admission order."""

    def __init__(self, max_events: int = MAX_EVENTS_PER_SESSION, max_pending: int = MAX_PENDING_EVENTS) -> None:
        self.max_events = max_events
        self.max_pending = max_pending
        self._events: dict[str, _Entry] = {}
        self._waiting = 0  # entries in a waiting state (admitted or acked): kept by `_set`

    # --- admission ------------------------------------------------------------------------
    def admit(self, event_id: str, fingerprint: bytes) -> bool:
        """True: a new event, now recorded. False: a retry, to be acked again and not applied.

        Raises `event_id_conflict` when the id was admitted with another payload, and
        `invalid_interaction` when the session is at its event bound; nothing is recorded
        then. Raises `UnknownPayload` for an id known only from an observed ack. Callers
        admit only messages that passed validation.
        """
        known = self._events.get(event_id)
        if known is None:
            if len(self._events) >= self.max_events:
                raise ProtocolError(
                    ErrorCode.INTERACTION_HISTORY_FULL,
                    f"this session has reached its limit of {self.max_events} interactions; start a new session",
                    event_id,
                )
            if self._waiting >= self.max_pending:
                raise ProtocolError(
                    ErrorCode.INTERACTION_QUEUE_FULL,
                    f"{self._waiting} interactions are waiting for a chunk boundary; send it again after the next chunk",
                    event_id,
                )
            self._events[event_id] = _Entry(fingerprint, EventState.ADMITTED)
            self._waiting += 1
            return True
        if known.fingerprint is None:
            raise UnknownPayload(event_id)
        if known.fingerprint == fingerprint:
            return False
        raise ProtocolError(
            ErrorCode.EVENT_ID_CONFLICT,
            f"event_id {event_id!r} was already used with a different payload",
            event_id,
        )

    def retract(self, event_id: str) -> None:
        """An admission that did not hold (the proxy could not keep the event, so never acked or
        forwarded it): the id is as if never admitted, and a retry of it is new."""
        entry = self._events.get(event_id)
        if entry is not None and entry.state is EventState.ADMITTED:
            del self._events[event_id]
            self._waiting -= 1

    def acked(self, event_id: str) -> None:
        """The event's ack was delivered. An id never admitted here (an ack this book only
        observes) is recorded as acked, payload unknown, within the session's bound."""
        entry = self._events.get(event_id)
        if entry is None:
            if len(self._events) < self.max_events:
                self._events[event_id] = _Entry(None, EventState.ACKED)
                self._waiting += 1
        elif entry.state is EventState.ADMITTED:
            entry.state = EventState.ACKED

    def holds(self, event_id: str, fingerprint: bytes) -> bool:
        """Whether `event_id` was admitted with this payload, or is known only from an observed
        ack (its payload unknown: the model admitted it): what a move may need to send again.
        False for an id the book refused (its event bound) or holds with another payload."""
        entry = self._events.get(event_id)
        return entry is not None and entry.fingerprint in (None, fingerprint)

    # --- what chunks and errors say -------------------------------------------------------
    def chunk(
        self,
        *,
        started: Iterable[str] = (),
        completed: Iterable[str] = (),
        interrupted: Iterable[str] = (),
        superseded: Iterable[str] = (),
    ) -> None:
        """One chunk's event lists, as sent to the client (started before ends: an event can
        start and complete on one chunk)."""
        for event_id in started:
            self._move(event_id, EventState.STARTED)
        for ids, state in (
            (completed, EventState.COMPLETED),
            (interrupted, EventState.INTERRUPTED),
            (superseded, EventState.SUPERSEDED),
        ):
            for event_id in ids:
                self._move(event_id, state)

    def failed(self, event_id: str) -> None:
        """The event's end is `interaction_failed`: nothing of it was (or will be) applied."""
        self._move(event_id, EventState.FAILED)

    def observe(self, message: Mapping[str, Any]) -> None:
        """A message as handed to the client: acks, chunk metadata and `interaction_failed`
        move the events they name."""
        kind = message.get("type")
        if kind == protocol.QUEUED and isinstance(message.get("event_id"), str):
            self.acked(message["event_id"])
        elif kind == protocol.CHUNK_METADATA:
            self.chunk(
                started=message.get("started_event_ids") or (),
                completed=message.get("completed_event_ids") or (),
                interrupted=message.get("interrupted_event_ids") or (),
                # vLLM-Omni 0.32's name for the same end (a 0.32 engine's chunks carry only it)
                superseded=[*(message.get("superseded_event_ids") or ()), *(message.get("coalesced_event_ids") or ())],
            )
        elif (
            kind == protocol.ERROR
            and message.get("code") == ErrorCode.INTERACTION_FAILED.value
            and isinstance(message.get("event_id"), str)
        ):
            self.failed(message["event_id"])

    def _move(self, event_id: str, state: EventState) -> None:
        entry = self._events.get(event_id)
        if entry is None or entry.state.ended:
            return  # never admitted here (not ours to report), or already at its one end
        if state is EventState.STARTED and entry.state not in _WAITING:
            return
        if entry.state in _WAITING:
            self._waiting -= 1
        entry.state = state

    # --- reading --------------------------------------------------------------------------
    def state(self, event_id: str) -> EventState | None:
        entry = self._events.get(event_id)
        return None if entry is None else entry.state

    def outcome(self, *, acked_only: bool = False) -> Outcome:
        """The events still without an end: waiting ones are unapplied, started ones unfinished.

        `acked_only`: leave out events whose ack was never delivered, for a reader that asks
        once every ack it will deliver has been (the proxy, as the socket takes a done)."""
        waiting = {EventState.ACKED} if acked_only else _WAITING
        unapplied = tuple(e for e, entry in self._events.items() if entry.state in waiting)
        unfinished = tuple(e for e, entry in self._events.items() if entry.state is EventState.STARTED)
        return Outcome(unapplied, unfinished)

    def done(self, request_id: str | None, *, chunks: int, stopped: bool, acked_only: bool = False) -> dict[str, Any]:
        """The `session.done` message: its lists are `outcome()`, the one definition of both."""
        outcome = self.outcome(acked_only=acked_only)
        return server_messages.done(
            request_id,
            chunks=chunks,
            stopped=stopped,
            unapplied_event_ids=list(outcome.unapplied),
            unfinished_event_ids=list(outcome.unfinished),
        )

    def __len__(self) -> int:
        return len(self._events)

    def __contains__(self, event_id: object) -> bool:
        return event_id in self._events
