"""A moved session's new stream, translated into the session's coordinates (docs/recordings.md
"Moves").

The model on the new Triton starts a new sequence: its own `video.start`, its own request id,
transport indices from 0, a new fMP4 stream (rtvideo.core.fmp4). What the client gets must be
one session: so the new `video.start` is dropped (the client had one), every message carries
the session's request id, transport indices and `session.done`'s `chunks` go on from the old
stream's, payloads continue its fMP4 stream (`Continuation`), and the model's answers to the
interactions the proxy sent again (the client had their acks) are dropped. The way up, a
playhead report is moved into the new stream's media time.

Until the new model answers the start, the splice is AWAITING; its `video.start` makes it
SPLICED; an error or `session.done` instead makes it REFUSED (the model could not rebuild the
session), and the session ends as it would have without a move.

Pure (no I/O): the session's upstream feeds it replies and reports.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Any

from rtvideo.core import protocol, server_messages
from rtvideo.core.chunks import MEDIA, TRAILER
from rtvideo.core.fmp4 import Continuation
from rtvideo.triton.wire import START_TAG, Reply


class SpliceState(enum.Enum):
    AWAITING = enum.auto()  # the new model has not answered the start
    SPLICED = enum.auto()  # its video.start came: its replies are the session's
    REFUSED = enum.auto()  # it answered the start with an error: the move failed


@dataclass(frozen=True)
class Coordinates:
    """Where the old stream stopped: what the new one continues."""

    request_id: str
    transport_chunk_index: int  # the next transport index
    media_seconds: float  # media time at the new stream's first frame


class Splice:
    """Translates one new stream's replies (module docstring)."""

    def __init__(self, at: Coordinates, continuation: Continuation | None) -> None:
        self._at = at
        self._continuation = continuation  # None: no payload was sent before (nothing to continue)
        self._dropped: set[str] = set()  # tags of interactions sent again
        self.state = SpliceState.AWAITING
        self.refusal: dict[str, Any] | None = None

    @property
    def continues(self) -> bool:
        """Whether its payloads continue an earlier stream (else they are the session's first)."""
        return self._continuation is not None

    def drop_answer(self, tag: str) -> None:
        """The model's answer to request `tag` (an interaction sent again) is not the client's."""
        self._dropped.add(tag)

    def translate(self, reply: Reply) -> Reply | None:
        """`reply` in the session's coordinates; None when it is not for the client. Raises
        `ContinuationError` when the payloads cannot continue the stream."""
        if reply.tag in self._dropped:
            self._dropped.discard(reply.tag)
            return None
        if self.state is SpliceState.REFUSED:
            return None  # the refused sequence's end: the session ends as it would have without a move
        message = reply.message
        if message is None:
            return reply
        kind = message.get("type")
        if self.state is SpliceState.AWAITING:
            if kind == protocol.VIDEO_START:
                self.state = SpliceState.SPLICED
                return None
            if kind in (protocol.ERROR, protocol.DONE) and reply.tag == START_TAG:
                self.state = SpliceState.REFUSED
                self.refusal = self.refusal or dict(message)
                return None
        out = dict(message)
        if "request_id" in out:
            out["request_id"] = self._at.request_id
        data = reply.data
        if kind == protocol.CHUNK_METADATA and isinstance(out.get("transport_chunk_index"), int):
            out["transport_chunk_index"] += self._at.transport_chunk_index
            if self._continuation is not None and data:
                if out.get("kind") == MEDIA:
                    data = self._continuation.media(data, int(out.get("num_frames") or 0))
                elif out.get("kind") == TRAILER:
                    data = self._continuation.trailer(data)
                out["byte_length"] = len(data)
        elif kind == protocol.DONE and isinstance(out.get("chunks"), int):
            out["chunks"] += self._at.transport_chunk_index
        return Reply(reply.tag, server_messages.encode(out), out, data, reply.received)

    def report(self, raw: bytes) -> bytes:
        """A playhead report (`session.playback`) in the new stream's media time (0 while the
        player still plays what the old stream sent)."""
        try:
            message = json.loads(raw)
            position = float(message["position_seconds"]) - self._at.media_seconds
        except (ValueError, KeyError, TypeError):
            return raw  # the model answers a bad report as it would have
        message["position_seconds"] = round(max(0.0, position), 6)
        return server_messages.encode(message).encode("utf-8", "surrogatepass")
