"""When a session's next chunk may go out (docs/protocol.md §7 "Pacing").

A fixed lead: chunk k is due `lead` chunks ahead of the viewer's playback, counted from when
the first chunk went out. With the player's `session.playback` reports (`PlayheadPacer`,
rtvideo/core/pacing.py) the due may move later, to the player's own buffer.

Threads: the session's worker waits here and tells it what it sent; the request path hands
in reports. Invariants: `_zero` is None until the first chunk went out and then only moves
later (a re-base after a pause); `_held` >= 0; the pacer is used only under `_lock`, which is
taken alone (never with the session's locks). Every wait wakes on the session's `wake`.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable
from typing import Any

from rtvideo.core.pacing import PlayheadPacer, ReportClamp
from rtvideo.core.streaming_pacing import PlayheadLead

#: while reports pace a session, its pacing wait recomputes the due this often (a report moves it)
REPACE_SECONDS = 0.05


class PlayerWait(enum.Enum):
    """What `PlaybackClock.wait_player` found."""

    GO = "go"  # the next chunk fits within the lead over the player's playhead
    WOKEN = "woken"  # a stop, a cancellation or the end came first
    IDLE = "idle"  # blocked on a player that made no progress for its idle_timeout_s


class PlaybackClock:
    """One session's pacing: the fixed lead (`lead_chunks`, None: no pacing), the reports' pacer,
    and vLLM-Omni 0.32's `streaming_pacing` bound over the reported playhead (`playhead`, None:
    the start did not ask for it)."""

    def __init__(
        self,
        *,
        chunk_seconds: float,
        fps: int,
        lead_chunks: float | None,
        pacer: PlayheadPacer | None,
        wake: threading.Event,
        touch: Callable[[], None],
        playhead: PlayheadLead | None = None,
    ) -> None:
        self._chunk_seconds = chunk_seconds
        self._fps = fps
        self._lead = lead_chunks
        self._pacer = pacer
        self._wake = wake  # set by a stop, a cancellation or the end
        self._touch = touch  # pacing is deliberate waiting, not a stall
        self._lock = threading.Lock()
        self._zero: float | None = None  # when the first chunk went out (the worker's clock)
        self._held = 0.0  # how much later than the fixed lead's due reports released the last chunk
        self._playhead = playhead  # used only under `_lock`, as the pacer

    # --- request path -----------------------------------------------------------------------
    def report(self, position_seconds: float, received: float, sent_seconds: float) -> ReportClamp | None:
        """A playhead report, kept for the pacing (clamped, never an error); None when this
        session does not pace to reports."""
        with self._lock:
            if self._playhead is not None:
                self._playhead.report(position_seconds, received)
            if self._pacer is None:
                return None
            return self._pacer.report(
                position_seconds, now=received, sent_seconds=sent_seconds, playback_zero=self._zero
            )

    # --- the worker -------------------------------------------------------------------------
    def lead_seconds(self, sent_seconds_after: float) -> float | None:
        """`playback_lead_seconds` (docs/protocol.md §6): the player's buffer once a chunk ending
        at `sent_seconds_after` is out, only while fresh reports pace the session."""
        if self._pacer is None:
            return None
        with self._lock:
            return self._pacer.lead(time.monotonic(), sent_seconds_after)

    def chunk_generated(self, media_seconds: float, retained_bytes: int) -> dict[str, Any] | None:
        """A chunk of `media_seconds` is about to go out: its `pacing` metadata (0.32's meanings),
        or None when the session is not paced to its playhead."""
        if self._playhead is None:
            return None
        with self._lock:
            self._playhead.generated(media_seconds, time.monotonic())
            return self._playhead.metadata(retained_bytes)

    def wait_player(self, next_seconds: float, idle_timeout: float) -> PlayerWait:
        """Wait until a chunk of `next_seconds` fits within the lead over the player's reported
        playhead (0.32's rule); IDLE when blocked `idle_timeout` seconds with no progress from it."""
        if self._playhead is None:
            return PlayerWait.GO
        blocked_since = time.monotonic()
        try:
            while True:
                now = time.monotonic()
                with self._lock:
                    if not self._playhead.blocked(next_seconds):
                        return PlayerWait.GO
                    idle = self._playhead.idle_for(now, blocked_since)
                if idle >= idle_timeout:
                    return PlayerWait.IDLE
                if self._wake.wait(min(REPACE_SECONDS, idle_timeout - idle)):
                    return PlayerWait.WOKEN
                self._touch()  # waiting for the player is deliberate, not a stall
        finally:
            self._add_wait(time.monotonic() - blocked_since)

    def _add_wait(self, seconds: float) -> None:
        if self._playhead is not None:
            with self._lock:
                self._playhead.waited(seconds)

    def chunk_sent(self, generate_seconds: float) -> None:
        """A chunk went out; it took `generate_seconds` from its boundary."""
        if self._pacer is not None:
            with self._lock:
                self._pacer.observe_chunk(generate_seconds)
        if self._zero is None:
            self._zero = time.monotonic()

    def wait_turn(self, chunks_sent: int, frames_sent: int) -> bool:
        """Wait until the next chunk is due; False when a stop, a cancellation or the end came first.

        A pause (a starved CPU, a stopped process) also stalled the client's playback: when the
        worker is more than a chunk behind the due, the clock is re-based instead of bursting
        the missed chunks out at once. A report's deliberate hold (`_held`) is no pause."""
        if self._zero is None or self._lead is None:
            return True
        due = self._zero + (chunks_sent - self._lead) * self._chunk_seconds
        began = time.monotonic()
        behind = began - due - self._held
        if behind > self._chunk_seconds:
            self._zero += behind
            due += behind
        try:
            return self._wait_paced(due, frames_sent / self._fps)
        finally:
            self._add_wait(time.monotonic() - began)

    def _wait_paced(self, fixed_due: float, media_start: float) -> bool:
        """The wait until `fixed_due`, unless fresh reports pace the session later
        (`PlayheadPacer.due`); then the due is recomputed every `REPACE_SECONDS`, so a new report
        moves it. The hold beyond `fixed_due` is kept (`_held`): the re-base after a pause must
        not take it for one, else each re-base would let a frozen player's reports hold the
        stream back by `max_behind_seconds` once more."""
        pacer, zero = self._pacer, self._zero
        if pacer is None or zero is None:
            return self._wait_until(fixed_due)
        while True:
            now = time.monotonic()
            with self._lock:
                reporting = pacer.reporting(now)
                due = pacer.due(fixed_due, media_start=media_start, playback_zero=zero, now=now)
            if not reporting or due <= now:
                self._held = max(0.0, due - fixed_due)
                return self._wait_until(due)
            if self._wake.wait(min(due - now, REPACE_SECONDS)):
                return False
            self._touch()

    def _wait_until(self, due: float) -> bool:
        left = due - time.monotonic()
        if left > 0 and self._wake.wait(left):
            return False
        self._touch()
        return True
