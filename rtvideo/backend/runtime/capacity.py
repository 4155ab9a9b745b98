"""Real-time capacity: how many frames per second the model delivers, and whether a start fits.

A session plays in real time only if its generator keeps up with its `fps`. The model knows
its capacity in frames per second at its default size (`width` x `height`), measured by the
generator itself (the built-in: a warm-up at load, `rtvideo.backend.builtin.warmup`; vLLM-Omni:
the engine's own time per chunk as it runs, `observe`), or set by the deployer
(`realtime_capacity_fps`).

A session's load is its `fps` scaled by its pixels against the default size (a 512x512 session
costs four 256x256 ones). A start is refused before `video.start` with `server_busy` (`Starts`),
so the proxy places it on another Triton, only when all of these hold:

- a session is live on the model: a start on an idle model is always tried. The figure is a
  measurement with noise (the project's own run measured a 5 fps stand-in at 4.9), and refusing
  the only session would lock the model shut for good, since a running figure is only measured
  while a session runs;
- the figure is known (nothing measured yet refuses nothing: the session limit still holds);
- the live sessions' loads plus the start's exceed the figure by more than `TOLERANCE`.

The running figure returns to the load-time one when nothing runs: after `IDLE_GRACE_SECONDS`
without a chunk its distance to the load-time figure halves every `IDLE_HALF_LIFE_SECONDS`; with
no load-time figure (vLLM-Omni measures nothing at load) it is forgotten after two half-lives, and
the next run measures afresh (a run after an idle spell never mixes its chunks with the last's).

Invariant: the figure only changes through `measured` (the load-time figure), `observe` (the
running one) and the passing of time while idle; with a fixed figure (`fixed`) none moves it.
Thread-safe: the engine's loop observes while the request thread admits.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from rtvideo.core.session_config import SessionConfig

#: how many of the engine's latest per-chunk rates the running figure is the median of: one slow
#: chunk (a compile, a loaded host) does not move it
RUNNING_SAMPLES = 8

#: how far the live sessions plus a start may exceed the figure and still be admitted (10%): the
#: figure is a median of a few chunks on a shared machine, so a start asking exactly what was
#: measured, or a hair more, is served rather than refused on noise
TOLERANCE = 0.10

#: no chunk for this long means nothing runs: the running figure starts returning to the load-time
#: one (longer than the gap between two chunks of any session playing in real time)
IDLE_GRACE_SECONDS = 10.0
#: then its distance to the load-time figure halves every this many seconds
IDLE_HALF_LIFE_SECONDS = 60.0
#: with no load-time figure to return to, the running one is forgotten at this weight
_FORGOTTEN_AT = 0.25

#: what `realtime_capacity_fps` takes besides a number
AUTO, OFF = "auto", "off"

#: `realtime_capacity_from` of a running figure from the engine's own per-chunk times, and of one
#: from the wall-clock gaps between a request's outputs (an engine whose outputs carry no times)
RUNNING, RUNNING_WALL_CLOCK = "running", "running (wall clock)"


def parse_setting(text: str) -> float | str:
    """`realtime_capacity_fps` as the model reads it: `auto` (measured), `off` (measured and
    reported, never refusing), or a positive number of frames per second (ValueError otherwise)."""
    word = str(text).strip().lower()
    if word in (AUTO, OFF):
        return word
    try:
        value = float(word)
    except ValueError:
        raise ValueError(f"realtime_capacity_fps {text!r}: use auto, off or a positive number") from None
    if not 0 < value < float("inf"):
        raise ValueError(f"realtime_capacity_fps {text!r}: use auto, off or a positive number")
    return value


def idle_weight(idle_seconds: float) -> float:
    """How much of the running figure still counts after `idle_seconds` without a chunk: 1 within
    the grace, then halving every half-life."""
    past = max(0.0, idle_seconds - IDLE_GRACE_SECONDS)
    return float(0.5 ** (past / IDLE_HALF_LIFE_SECONDS))


class RealtimeCapacity:
    """The model's real-time capacity and the admission rule built on it."""

    def __init__(
        self,
        width: int,
        height: int,
        setting: float | str = AUTO,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`clock`: monotonic seconds (tests pass their own to age the running figure)."""
        self._pixels = width * height  # the default size: capacity is counted in its frames
        self._clock = clock
        self._lock = threading.Lock()
        self._fixed = None if isinstance(setting, str) else float(setting)
        self.refuses = setting != OFF
        self._at_load: tuple[float, str] | None = None  # the load-time figure and how it was had
        self._running: tuple[float, str] | None = None  # the median of `_samples`, and its source
        self._last_chunk: float | None = None  # when the latest sample was taken (the clock's)
        self._samples: deque[float] = deque(maxlen=RUNNING_SAMPLES)

    @property
    def fps(self) -> float | None:
        """Frames per second at the default size the model delivers in real time (None: unknown)."""
        return self._figure()[0]

    def _figure(self) -> tuple[float | None, str | None]:
        """The figure now and how it was obtained."""
        if self._fixed is not None:
            return self._fixed, "setting"
        now = self._clock()
        with self._lock:
            at_load, running, last = self._at_load, self._running, self._last_chunk
        if running is None or last is None:
            return at_load if at_load is not None else (None, None)
        weight = idle_weight(now - last)
        if weight >= 1.0:
            return running
        if at_load is None:  # nothing to return to: kept a while, then forgotten
            return running if weight > _FORGOTTEN_AT else (None, None)
        fps = at_load[0] + (running[0] - at_load[0]) * weight
        return fps, f"{running[1]}, returning to {at_load[1]} (idle)"

    def measured(self, fps: float, how: str) -> None:
        """The figure measured at load (the built-in's warm-up); ignored when the deployer fixed it."""
        with self._lock:
            if self._fixed is None and fps > 0:
                self._at_load = (fps, how)

    def observe(
        self, frames: int, seconds: float, width: int, height: int, concurrent: int, how: str = RUNNING
    ) -> None:
        """One chunk of `frames` frames at `width`x`height` took the generator `seconds` while
        `concurrent` requests ran at once (batched, so each chunk's time is the whole batch's):
        the running figure is the median of the latest chunks' aggregate rates, in frames at the
        default size. `how`: where `seconds` came from (`RUNNING`, `RUNNING_WALL_CLOCK`)."""
        if frames <= 0 or seconds <= 0 or self._fixed is not None:
            return
        rate = frames / seconds * max(1, concurrent) * (width * height) / self._pixels
        now = self._clock()
        with self._lock:
            if self._last_chunk is not None and idle_weight(now - self._last_chunk) < 1.0:
                self._samples.clear()  # a new run after an idle spell: measured afresh
            self._samples.append(rate)
            self._running, self._last_chunk = (statistics.median(self._samples), how), now

    def load(self, config: SessionConfig) -> float:
        """What one session takes of the capacity: its fps in frames at the default size."""
        return config.fps * (config.width * config.height) / self._pixels

    def refusal(self, config: SessionConfig, live: Iterable[SessionConfig]) -> str | None:
        """Why a start of `config` cannot be served in real time beside the `live` sessions (then
        `server_busy`), or None. Never refuses a start when no session is live (module docstring)."""
        live = list(live)
        if not live or not self.refuses:
            return None
        capacity = self.fps
        if capacity is None:
            return None
        taken = sum(self.load(c) for c in live)
        wanted = self.load(config)
        if taken + wanted <= capacity * (1 + TOLERANCE):
            return None
        return (
            f"this model delivers about {capacity:.0f} frames per second in real time (at its default size); "
            f"its live sessions take {taken:.0f} and this start asks {wanted:.0f} "
            f"({config.width}x{config.height} at {config.fps} fps), more than the figure and its "
            f"{TOLERANCE:.0%} tolerance; try again later or ask for less"
        )

    def describe(self, live: Iterable[SessionConfig] = ()) -> dict[str, Any]:
        """For the health probe's pong (`GET /v1/models` reads it): the figure, how it was
        obtained, and what the live sessions take of it."""
        fps, how = self._figure()
        return {
            "realtime_capacity_fps": None if fps is None else round(fps, 1),
            "realtime_capacity_from": how,
            "realtime_load_fps": round(sum(self.load(c) for c in live), 1),
            "refuses_above_capacity": self.refuses,
            "realtime_capacity_tolerance": TOLERANCE,
        }
