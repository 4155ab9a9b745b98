"""The rules behind the playback metrics (docs/operations.md, "Playback and model health
metrics", lists their names and healthy values; rtvideo.proxy.observability.metrics declares
them): `UnderrunDetector` and `LateChunks` are one session's pure rules (times passed in), fed
by rtvideo.proxy.observability.session_timing.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LateChunks", "UnderrunDetector"]

#: a reported buffer at or below this many seconds counts as empty (a frame at 30 fps is 0.033 s)
EMPTY_SECONDS = 0.05
#: a position that moved less than this between two reports stood still
STILL_SECONDS = 0.01
#: a chunk handed out later than its media start by more than this is late (timer jitter)
LATE_TOLERANCE_SECONDS = 0.01


@dataclass(frozen=True)
class Underrun:
    """A change of one session's underrun state: `began`, or ended after `seconds`."""

    began: bool
    seconds: float = 0.0


class UnderrunDetector:
    """One session's underruns, from its player's reports (position, buffered, arrival time).

    An underrun is a player standing still with nothing to play: two reports in a row at the
    same position (within `STILL_SECONDS`) whose buffer is empty (`buffered_seconds`, else the
    media handed out minus the position, at most `EMPTY_SECONDS`). It begins at the first of
    them, once playback has begun (a position above 0 was reported: the wait for the first
    frame is the time to first chunk, not an underrun), and not after the stream's end (a
    player at the end of a finished stream stands still by design). It ends when a report's
    position moved on: at that report's time less the media played since (the player ran at
    real time from the moment it resumed), never before the last still report; or at
    `finish()`, at the last still report. Pure: times are passed in.
    """

    def __init__(self) -> None:
        self._playing = False
        self._ended = False
        self._position: float | None = None
        self._empty_since: float | None = None  # first report of the run standing still, empty
        self._began: float | None = None  # an underrun in progress: when it began
        self._last_still: float | None = None

    def stream_ended(self) -> None:
        """The stream's end was handed out: no new underrun begins."""
        self._ended = True

    def report(self, at: float, position: float, buffered: float) -> Underrun | None:
        previous, self._position = self._position, position
        if position > 0:
            self._playing = True
        moved = previous is None or abs(position - previous) >= STILL_SECONDS
        if self._began is not None:
            if not moved:
                self._last_still = at
                return None
            began, last = self._began, self._last_still or self._began
            self._began = self._last_still = None
            self._empty_since = at if buffered <= EMPTY_SECONDS else None
            # played `position - previous` at real time since it resumed; a jump back (a seek) says nothing
            played = position - previous if previous is not None and position > previous else None
            resumed = last if played is None else max(last, at - played)
            return Underrun(False, resumed - began)
        if buffered > EMPTY_SECONDS or moved:
            self._empty_since = at if buffered <= EMPTY_SECONDS else None
            return None
        if self._empty_since is None:
            self._empty_since = at
            return None
        if not self._playing or self._ended:
            return None
        self._began, self._last_still = self._empty_since, at
        return Underrun(True)

    def finish(self) -> Underrun | None:
        """The session ended: an underrun in progress ends at its last still report."""
        if self._began is None:
            return None
        seconds = (self._last_still or self._began) - self._began
        self._began = self._last_still = None
        return Underrun(False, seconds)


class LateChunks:
    """One session's late chunks in pacing's own view: a player that started on the first media
    chunk and plays at real time needs chunk n at `zero + media before n`. A chunk handed out
    after that (by more than `LATE_TOLERANCE_SECONDS`) is late; the player waited for it, so its
    clock moves on from there (`zero` re-based, as the model's pacing does after a pause), and
    one slow chunk counts once, not with every chunk after it. Pure: times are passed in."""

    def __init__(self) -> None:
        self._zero: float | None = None
        self._media = 0.0  # media seconds handed out before the next chunk

    def chunk(self, at: float, seconds: float) -> bool:
        """A media chunk of `seconds` handed out at `at`; whether it was late."""
        late = False
        if self._zero is None:
            self._zero = at
        else:
            due = self._zero + self._media
            if at > due + LATE_TOLERANCE_SECONDS:
                late = True
                self._zero = at - self._media
        self._media += seconds
        return late
