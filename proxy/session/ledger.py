"""What one session's client has been handed, frame by frame, and the lists of every
`session.done` it gets (docs/protocol.md §3.3).

The session's `EventBook` (rtvideo.core.event_book) is the one record of its events: the
proxy admits its own acks there (rtvideo.proxy.session.acks), and the ledger feeds it every frame
at the moment the socket takes it. A `session.done`, the model's or one the proxy writes
itself (slow consumer, backend failure, shutdown), gets its lists from the book at that
same moment, so they account for exactly the frames before it: every event whose ack the
client got has one visible end, and no event it never heard of is named.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rtvideo.core import protocol, server_messages
from rtvideo.core.event_book import EventBook
from rtvideo.proxy.frames import Frame


@dataclass
class Ledger:
    book: EventBook = field(default_factory=EventBook)
    request_id: str | None = None  # of the video.start handed out
    chunks: int = 0  # binary frames handed out
    last_transport: int | None = None  # the transport index of the last chunk handed out

    def taken(self, frame: Frame) -> Frame:
        """One frame (or pair) handed to the socket, in order; returns what is written: the frame,
        or for a `session.done` the same message with the book's lists."""
        message = frame.message
        kind = message.get("type")
        if kind == protocol.DONE:
            # Every ack the client will get is ahead of it: one the book still holds as merely
            # admitted was never handed out (the session ended first), so it is not named.
            outcome = self.book.outcome(acked_only=True)
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
        self.book.observe(message)
        return frame

    def done(self) -> dict[str, Any]:
        """The `session.done` for an end the model did not report itself."""
        return self.book.done(self.request_id, chunks=self.chunks, stopped=False, acked_only=True)
