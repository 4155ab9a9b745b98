"""Stand-ins for the session runtime's unit tests: a generator that can crash or stall, and the
secret their sessions carry."""

from __future__ import annotations

import time
from collections.abc import Mapping

import numpy as np

#: the session secret every request of these tests' sessions carries (docs/protocol.md §8)
SECRET = "unit-test-session-secret"


class StandInGenerator:
    def __init__(self, behaviour: str = "ok") -> None:
        self.behaviour = behaviour
        self.closed = 0

    def open_session(self, *, width: int, height: int, seed: int, fps: int | None = None) -> StandInGenerator:
        self.shape = (height, width, 3)
        return self

    def generate(self, mix: Mapping[str, float], num_frames: int) -> np.ndarray:
        if self.behaviour == "crash":
            raise RuntimeError("GPU fell off the bus")
        if self.behaviour == "stall":
            time.sleep(1.5)
        return np.full((num_frames, *self.shape), 90, np.uint8)

    def close(self) -> None:
        self.closed += 1
