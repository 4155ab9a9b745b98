"""What a session handed its owner, kept for whoever attaches or listens later.

Every frame the owner's socket takes (not a replayed one) goes, in order, to each tap: the
replay buffer (a resumed owner is given what its old connection may have lost,
rtvideo.proxy.participants.replay), the watchers' hub (rtvideo.proxy.participants.watchers) and any `RecordingSink`.
Kept besides: the `video.start` as handed out (without tokens: a watcher's and a resumed
owner's are built from it) and the stream's init segment (the init pair of docs/protocol.md
§9).

Pure (no I/O): the session feeds it; the taps do their own writing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from rtvideo.core import server_messages
from rtvideo.core.chunks import init_metadata
from rtvideo.core.fmp4 import init_segment
from rtvideo.proxy.frames import Frame

#: sees every frame handed to the owner, in order, as the socket takes it
FrameTap = Callable[[Frame], None]


class RecordingSink(Protocol):
    """Where a recording of a session attaches (`Handouts.record_to`): every frame the owner
    is handed, in order, as the socket takes it (video.start, acks, errors, chunk pairs, the
    session.done with its lists: the session's event log), then the end. A sink must not
    block: it is called on the event loop, in the owner's write path."""

    def handed_out(self, frame: Frame) -> None: ...

    def session_ended(self) -> None:
        """The session is over (after its last frame, or without a session.done handed out)."""
        ...


class Handouts:
    """One session's record of what its owner was handed, and the taps that follow it."""

    def __init__(self) -> None:
        self._start: dict[str, Any] | None = None  # video.start as handed out, without tokens
        self._init_payload: bytes | None = None  # the stream's ftyp+moov, from its first payload
        self._taps: list[FrameTap] = []
        self._sinks: list[RecordingSink] = []

    def keep_start(self, message: dict[str, Any]) -> None:
        self._start = dict(message)

    def restore(self, start: dict[str, Any], init: bytes | None) -> None:
        """What another proxy handed out before this one took the session over."""
        self._start = dict(start)
        self._init_payload = init

    def tap(self, tap: FrameTap) -> None:
        self._taps.append(tap)

    def record_to(self, sink: RecordingSink) -> None:
        self._sinks.append(sink)
        self.tap(sink.handed_out)

    def handed_out(self, frame: Frame) -> None:
        """A frame handed to the owner's socket (not a replayed one)."""
        if not self._taps:
            return
        if self._init_payload is None and frame.data is not None:
            self._init_payload = init_segment(frame.data)
        for tap in self._taps:
            tap(frame)

    def ended(self) -> None:
        for sink in self._sinks:
            sink.session_ended()

    def init_frame(self, request_id: str | None) -> Frame | None:
        """The init pair (docs/protocol.md §9), once the stream's first payload was handed out."""
        if self._init_payload is None or request_id is None:
            return None
        meta = init_metadata(request_id, len(self._init_payload))
        return Frame(server_messages.encode(meta), meta, self._init_payload, replay=True)

    def start_for(self, **marks: Any) -> dict[str, Any] | None:
        """video.start for a participant that attaches later: the owner's, with `marks` (a
        watcher's `"watcher": true`, a resumed owner's flag and tokens)."""
        if self._start is None:
            return None
        return {**self._start, **marks}
