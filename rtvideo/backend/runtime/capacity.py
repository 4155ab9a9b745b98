"""Real-time capacity: how many frames per second the model delivers, and whether a start fits.

A session plays in real time only if its generator keeps up with its `fps`. The model knows
its capacity in frames per second at its default size (`width` x `height`), measured by the
generator itself (the built-in: a warm-up at load, `rtvideo.backend.builtin.warmup`; vLLM-Omni:
the engine's running rate, `observe`), or set by the deployer (`realtime_capacity_fps`).

A session's load is its `fps` scaled by its pixels against the default size (a 512x512 session
costs four 256x256 ones). A start whose load, beside the live sessions' loads, exceeds the
capacity is refused before `video.start` with `server_busy` (`Starts`), so the proxy places it
on another Triton. Unknown capacity (nothing measured yet) refuses nothing: the session limit
still holds.

Invariant: `fps` only changes through `measured` (the warm-up's figure) and `observe` (the
running figure); with a fixed figure (`fixed`) neither moves it. Thread-safe: the engine's loop
observes while the request thread admits.
"""

from __future__ import annotations

import statistics
import threading
from collections import deque
from collections.abc import Iterable
from typing import Any

from rtvideo.core.session_config import SessionConfig

#: how many of the engine's latest per-chunk rates the running figure is the median of: one slow
#: chunk (a compile, a loaded host) does not move it
RUNNING_SAMPLES = 8

#: what `realtime_capacity_fps` takes besides a number
AUTO, OFF = "auto", "off"


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


class RealtimeCapacity:
    """The model's real-time capacity and the admission rule built on it."""

    def __init__(self, width: int, height: int, setting: float | str = AUTO) -> None:
        self._pixels = width * height  # the default size: capacity is counted in its frames
        self._lock = threading.Lock()
        self._fixed = None if isinstance(setting, str) else float(setting)
        self.refuses = setting != OFF
        self._fps: float | None = self._fixed
        self._how = "setting" if self._fixed is not None else None
        self._samples: deque[float] = deque(maxlen=RUNNING_SAMPLES)

    @property
    def fps(self) -> float | None:
        """Frames per second at the default size the model delivers in real time (None: unknown)."""
        with self._lock:
            return self._fps

    def measured(self, fps: float, how: str) -> None:
        """A measurement (the warm-up at load); ignored when the deployer fixed the figure."""
        with self._lock:
            if self._fixed is None and fps > 0:
                self._fps, self._how = fps, how

    def observe(self, frames: int, seconds: float, width: int, height: int, concurrent: int) -> None:
        """One chunk of `frames` frames at `width`x`height` took the generator `seconds` while
        `concurrent` requests shared it: the running figure is the median of the latest
        chunks' aggregate rates, in frames at the default size."""
        if frames <= 0 or seconds <= 0:
            return
        rate = frames / seconds * max(1, concurrent) * (width * height) / self._pixels
        with self._lock:
            if self._fixed is not None:
                return
            self._samples.append(rate)
            self._fps, self._how = statistics.median(self._samples), "running"

    def load(self, config: SessionConfig) -> float:
        """What one session takes of the capacity: its fps in frames at the default size."""
        return config.fps * (config.width * config.height) / self._pixels

    def refusal(self, config: SessionConfig, live: Iterable[SessionConfig]) -> str | None:
        """Why a start of `config` cannot be served in real time beside the `live` sessions (then
        `server_busy`), or None."""
        capacity = self.fps
        if capacity is None or not self.refuses:
            return None
        taken = sum(self.load(c) for c in live)
        wanted = self.load(config)
        if taken + wanted <= capacity:
            return None
        return (
            f"this model delivers about {capacity:.0f} frames per second in real time (at its default size); "
            f"its live sessions take {taken:.0f} and this start asks {wanted:.0f} "
            f"({config.width}x{config.height} at {config.fps} fps); try again later or ask for less"
        )

    def describe(self, live: Iterable[SessionConfig] = ()) -> dict[str, Any]:
        """For the health probe's pong (`GET /v1/models` reads it): the figure, how it was
        obtained, and what the live sessions take of it."""
        with self._lock:
            fps, how = self._fps, self._how
        return {
            "realtime_capacity_fps": None if fps is None else round(fps, 1),
            "realtime_capacity_from": how,
            "realtime_load_fps": round(sum(self.load(c) for c in live), 1),
            "refuses_above_capacity": self.refuses,
        }
