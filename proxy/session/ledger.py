"""What one session's client has been handed, frame by frame, and the lists of every
`session.done` it gets (docs/protocol.md §3.3).

The session's `EventBook` (rtvideo.core.event_book) is the one record of its events, and the
`Ledger` is its one writer: the proxy's own acks admit (and retract) their events through it
(`admit`, `retract`: rtvideo.proxy.session.acks), and it feeds the book every frame at the
moment the owner's socket takes it (`taken`) and every message written to a guest steerer
alone (`told_guest`). A `session.done`, the model's or one the proxy writes itself (slow
consumer, backend failure, shutdown), gets its lists from the book at that same moment, so
they account for exactly the frames before it: every event whose ack the client got has one
visible end, and no event it never heard of is named. Every other part reads the book through
`Ledger.book`, a `BookView` that cannot write it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rtvideo.core import protocol, server_messages
from rtvideo.core.event_book import EventBook, Outcome
from rtvideo.proxy.frames import Frame


class BookView:
    """A session's `EventBook`, read-only: what a move, the in-band figures and the tests read."""

    def __init__(self, book: EventBook) -> None:
        self._book = book

    def outcome(self, *, acked_only: bool = False) -> Outcome:
        return self._book.outcome(acked_only=acked_only)

    def holds(self, event_id: str, fingerprint: bytes) -> bool:
        return self._book.holds(event_id, fingerprint)

    def __len__(self) -> int:
        return len(self._book)


class Ledger:
    """One session's event book and what its owner was handed.

    Invariant: the ledger is the only writer of the session's `EventBook` (admissions through
    `admit`/`retract`, what the client is written through `taken`/`told_guest`); every other
    part holds the read-only `book`, so the lists of each `session.done` follow from the calls
    made here alone, in the order they were made."""

    def __init__(self, book: EventBook | None = None) -> None:
        self._book = EventBook() if book is None else book
        self._view = BookView(self._book)
        self.request_id: str | None = None  # of the video.start handed out
        self.chunks = 0  # binary frames handed out
        self.last_transport: int | None = None  # the transport index of the last chunk handed out

    @property
    def book(self) -> BookView:
        """The session's event book, read-only."""
        return self._view

    def admit(self, event_id: str, fingerprint: bytes) -> bool:
        """An interaction the proxy acks itself (`EventBook.admit`: True new, False a retry)."""
        return self._book.admit(event_id, fingerprint)

    def retract(self, event_id: str) -> None:
        """An admission that did not hold (`EventBook.retract`)."""
        self._book.retract(event_id)

    def stored(self, event_id: str) -> None:
        """An event admitted from the record of a session taken over (rtvideo.proxy.session.restore):
        the replica before wrote it to the store before it forwarded it and before its ack could
        leave, so it counts as acked, whether or not the store got the ack's frame too (that frame
        is written after the ack, and a holder cut off from the store or gone may never write it).
        A move then sends it again if no chunk the store kept started it, and every `session.done`
        accounts for it: an ack the owner may hold is never lost (docs/decisions.md "The session
        store under faults")."""
        self._book.acked(event_id)

    def told_guest(self, message: Mapping[str, Any]) -> None:
        """A message written to a guest steerer alone (its ack, an interaction_failed): the book
        sees it as it sees what the owner is handed."""
        self._book.observe(message)

    def taken(self, frame: Frame) -> Frame:
        """One frame (or pair) handed to the socket, in order; returns what is written: the frame,
        or for a `session.done` the same message with the book's lists."""
        message = frame.message
        kind = message.get("type")
        if kind == protocol.DONE:
            # Every ack the client will get is ahead of it: one the book still holds as merely
            # admitted was never handed out (the session ended first), so it is not named.
            outcome = self._book.outcome(acked_only=True)
            done = {
                **message,
                "unapplied_event_ids": list(outcome.unapplied),
                "unfinished_event_ids": list(outcome.unfinished),
            }
            return frame if done == message else Frame(server_messages.encode(done), done)
        self.chunks += frame.data is not None
        if frame.data is not None and isinstance(index := message.get("transport_chunk_index"), int):
            self.last_transport = index
        if kind == protocol.VIDEO_START:
            self.request_id = message.get("request_id")
        self._book.observe(message)
        return frame

    def done(self) -> dict[str, Any]:
        """The `session.done` for an end the model did not report itself."""
        return self._book.done(self.request_id, chunks=self.chunks, stopped=False, acked_only=True)
