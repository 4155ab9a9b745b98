"""Pacing to the player: when to start generating the next chunk (docs/protocol.md §7, "Pacing").

Pure: times are passed in (seconds on one monotonic clock), nothing here sleeps or reads a clock.

Today's rule (no playhead reports) releases chunk n at `playback_zero + (n - lead) * chunk_seconds`:
the stream runs `lead` chunks ahead of a player assumed to have started when the first chunk was
sent. Its buffer when a chunk's generation starts is therefore `lead * chunk_seconds`, and an
update shows about one chunk plus the boundary wait after it was sent.

With playhead reports (`session.playback`) the server knows where the player is, so it can
start chunk n just early enough for it to arrive before the player needs it:

- **target buffer** (media seconds the player still has to play when chunk n's generation
  starts) = `mean + JITTER_FACTOR * stdev + headroom` of the last `window` measured chunk
  times (boundary → chunk handed to the transport), clamped to `[floor, lead * chunk_seconds]`.
  With fewer than `MIN_SAMPLES` measurements it is today's `lead * chunk_seconds`, and the due
  is today's too (`behind` is not applied before then).
- **behind**: how far the player is behind the wall-clock playhead that today's rule assumes,
  from the latest report: `(t_report - playback_zero) - position`, clamped to
  `[0, max_behind_seconds]`.
- **due** = `playback_zero + behind + media_start - target`, never earlier than today's due
  (`behind >= 0` and `target <= lead * chunk_seconds` make that hold by construction, and
  `due` takes the maximum anyway).

Reports that lie are clamped, never trusted beyond what the server knows: a position ahead of
what was sent is taken as the sent end; ahead of the wall clock gives `behind = 0` (today's
pacing, never faster); going backwards keeps the previous position; a frozen or far-behind
player counts as at most `max_behind_seconds` behind, so the stream is delayed by at most that
once and then runs at real time again (a lying client cannot stall its session). A report older
than `stale_seconds` is forgotten: a client that stops reporting gets today's pacing again.
"""

from __future__ import annotations

import enum
import math
import statistics
from collections import deque
from dataclasses import dataclass

#: the measured chunk times the target buffer is computed from need at least this many samples
MIN_SAMPLES = 3
#: standard deviations of the recent chunk times the target buffer keeps above their mean
JITTER_FACTOR = 3.0


class ReportClamp(enum.Enum):
    """What a playhead report needed before it was used (the rule in the module docstring)."""

    NONE = "none"  # used as sent
    AHEAD_OF_SENT = "ahead_of_sent"  # position beyond the media sent so far: the sent end
    AHEAD_OF_CLOCK = "ahead_of_clock"  # beyond the wall-clock playhead: behind = 0
    BACKWARDS = "backwards"  # below the previous report: the previous position
    BEHIND_LIMIT = "behind_limit"  # further behind than max_behind_seconds: that bound


@dataclass(frozen=True)
class PacingPolicy:
    """The parameters of the rule. `lead_chunks` is today's fixed lead (`pacing_lead_chunks`):
    the target never exceeds it, so reports can only make the stream run closer to the player."""

    chunk_seconds: float
    lead_chunks: float
    #: the chunk-time sample ends where the model hands a chunk to Triton: the rest of its way
    #: (Triton -> proxy -> WebSocket -> the page's append, and the report's own trip, which makes
    #: `behind` read late by as much) is not in it; the headroom and floor cover that part
    floor_seconds: float = 0.15
    headroom_seconds: float = 0.12
    window: int = 8
    stale_seconds: float = 1.5
    max_behind_seconds: float = 2.0

    def __post_init__(self) -> None:
        for name in ("chunk_seconds", "lead_chunks", "floor_seconds", "headroom_seconds", "max_behind_seconds"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"pacing {name} must be a finite number >= 0, not {value!r}")
        if self.chunk_seconds <= 0 or self.stale_seconds <= 0:
            raise ValueError("pacing chunk_seconds and stale_seconds must be positive")
        if self.window < MIN_SAMPLES:
            raise ValueError(f"pacing window must be at least {MIN_SAMPLES}")

    @property
    def fixed_buffer(self) -> float:
        """Today's buffer when a chunk's generation starts: the upper bound of the target."""
        return self.lead_chunks * self.chunk_seconds


@dataclass(frozen=True)
class _Report:
    position: float  # media seconds, clamped
    at: float  # when it arrived (monotonic)


class PlayheadPacer:
    """One session's view of its player: the latest clamped report and the recent chunk times.

    Reports arrive on the request path, the rest on the session's worker: the caller holds
    whatever lock it shares between them (every method is a few arithmetic steps)."""

    def __init__(self, policy: PacingPolicy) -> None:
        self.policy = policy
        self._times: deque[float] = deque(maxlen=policy.window)
        self._report: _Report | None = None

    # --- inputs -----------------------------------------------------------------------------
    def observe_chunk(self, seconds: float) -> None:
        """One chunk's time from its boundary to being handed to the transport."""
        if math.isfinite(seconds) and seconds >= 0:
            self._times.append(seconds)

    def report(self, position: float, *, now: float, sent_seconds: float, playback_zero: float | None) -> ReportClamp:
        """A player's `position_seconds` at `now`; `sent_seconds`: media sent so far;
        `playback_zero`: when the first chunk went out (None: none yet)."""
        clamp = ReportClamp.NONE
        if not math.isfinite(position) or position < 0:
            position, clamp = 0.0, ReportClamp.BACKWARDS
        if position > sent_seconds:
            position, clamp = sent_seconds, ReportClamp.AHEAD_OF_SENT
        previous = self._report
        if previous is not None and position < previous.position:
            position, clamp = previous.position, ReportClamp.BACKWARDS
        if playback_zero is not None and clamp is ReportClamp.NONE:
            behind = (now - playback_zero) - position
            if behind < 0:
                clamp = ReportClamp.AHEAD_OF_CLOCK
            elif behind > self.policy.max_behind_seconds:
                clamp = ReportClamp.BEHIND_LIMIT
        self._report = _Report(position, now)
        return clamp

    # --- the rule ---------------------------------------------------------------------------
    def reporting(self, now: float) -> bool:
        """Whether a report is fresh enough to pace by."""
        report = self._report
        return report is not None and now - report.at <= self.policy.stale_seconds

    def target_buffer(self) -> float:
        """Media seconds the player should still hold when a chunk's generation starts."""
        policy = self.policy
        if len(self._times) < MIN_SAMPLES:
            return policy.fixed_buffer
        times = list(self._times)
        wanted = statistics.fmean(times) + JITTER_FACTOR * statistics.pstdev(times) + policy.headroom_seconds
        return min(policy.fixed_buffer, max(policy.floor_seconds, wanted))

    def behind(self, playback_zero: float) -> float:
        """How far the player is behind the wall-clock playhead, clamped to [0, max_behind]."""
        report = self._report
        if report is None:
            return 0.0
        lag = (report.at - playback_zero) - report.position
        return min(self.policy.max_behind_seconds, max(0.0, lag))

    def due(self, fixed_due: float, *, media_start: float, playback_zero: float, now: float) -> float:
        """When to start generating the chunk whose media starts at `media_start`: today's
        `fixed_due` without a fresh report, else the rule's (never earlier than `fixed_due`)."""
        if not self.reporting(now) or len(self._times) < MIN_SAMPLES:
            # nothing to size the buffer by yet, and at a session's start a busy server's reports
            # arrive late, which reads as the player being behind: today's due, as without reports
            return fixed_due
        paced = playback_zero + self.behind(playback_zero) + media_start - self.target_buffer()
        return max(fixed_due, paced)

    def lead(self, now: float, sent_seconds: float) -> float | None:
        """The server's view of the player's buffer (sent media minus the estimated playhead);
        None without a fresh report."""
        report = self._report
        if report is None or not self.reporting(now):
            return None
        playhead = min(sent_seconds, report.position + (now - report.at))
        return sent_seconds - playhead
