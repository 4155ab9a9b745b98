"""What a resumable session's client was handed, kept so that a new connection can be given
what the old one may have lost (docs/protocol.md §9).

Every frame handed to the socket (chunk pairs with their original metadata text, acks,
per-message errors; not pongs, not `video.start`) is recorded in order. A resume from `K`
(the last payload the client fully received) gets every recorded frame after the pair with
transport index `K`: the acks the old connection may not have delivered come before the
chunks that mention them, because that is the order they were handed out in.

Bounded in bytes: the oldest frames go first, always a whole *unit* at a time (the frames
up to and including one pair), so the buffer always starts right after a pair and a resume
from that pair's index or later is complete; a resume from before it is refused with the
smallest `K` it can serve (`ReplayGap.oldest`).

Pure (no I/O): the session feeds it and reads it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from rtvideo.core import protocol
from rtvideo.proxy.frames import Frame

#: messages not replayed: `video.start` is sent afresh; a pong answers a ping of the old
#: connection; `session.done` ends the session, so nothing could resume after it
_NOT_RECORDED = frozenset({protocol.VIDEO_START, protocol.PONG, protocol.DONE})


class ReplayGap(Exception):
    """A resume index the buffer cannot serve; `oldest` is the smallest one it can (or None
    when the index is ahead of what was handed out)."""

    def __init__(self, message: str, oldest: int | None) -> None:
        super().__init__(message)
        self.oldest = oldest


@dataclass
class ReplayBuffer:
    """The frames handed out after the oldest resumable pair, within `limit` bytes."""

    limit: int
    _units: deque[list[Frame]] = field(default_factory=deque)  # each ends with a pair, but the last
    _bytes: int = 0
    _evicted_through: int = -1  # transport index of the last pair evicted (-1: none)
    last_index: int = -1  # transport index of the last pair recorded

    def record(self, frame: Frame) -> None:
        """One frame handed to the socket, in order."""
        if frame.message.get("type") in _NOT_RECORDED:
            return
        if not self._units or _ends_unit(self._units[-1][-1]):
            self._units.append([])
        self._units[-1].append(frame)
        self._bytes += frame.size
        index = _pair_index(frame)
        if index is not None:
            self.last_index = index
        # the newest unit stays, even when it alone is over the bound
        while self._bytes > self.limit and len(self._units) > 1:
            unit = self._units.popleft()
            self._bytes -= sum(f.size for f in unit)
            evicted = _pair_index(unit[-1])
            assert evicted is not None  # every unit but the last ends with a pair
            self._evicted_through = evicted

    def resumes_after(self, index: int) -> None:
        """An empty buffer restored by a takeover starts after the pair `index` (the last one
        whose payload the store no longer kept; -1: none)."""
        assert not self._units
        self._evicted_through = self.last_index = index

    @property
    def size(self) -> int:
        return self._bytes

    def after(self, last: int) -> list[Frame]:
        """The frames handed out after the pair with transport index `last` (-1: all)."""
        if last < self._evicted_through:
            raise ReplayGap(
                f"last_transport_chunk_index {last} is older than the replay buffer; the oldest "
                f"resumable index is {self._evicted_through}",
                self._evicted_through,
            )
        if last > self.last_index:
            raise ReplayGap(
                f"last_transport_chunk_index {last} was never sent (the last payload sent is {self.last_index})",
                None,
            )
        frames = [f for unit in self._units for f in unit]
        if last == self._evicted_through:
            return frames
        for position, frame in enumerate(frames):
            if _pair_index(frame) == last:
                return frames[position + 1 :]
        raise AssertionError(f"pair {last} is within the buffer but not in it")  # pragma: no cover


def _pair_index(frame: Frame) -> int | None:
    if frame.data is None or frame.message.get("type") != protocol.CHUNK_METADATA:
        return None
    index = frame.message.get("transport_chunk_index")
    return index if isinstance(index, int) else None


def _ends_unit(frame: Frame) -> bool:
    return _pair_index(frame) is not None
