"""What the session runtime needs from its host (Triton or a test harness), as protocols."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from rtvideo.core.codec_options import EncoderOptions
from rtvideo.core.conditioning import Conditioning
from rtvideo.core.pose import Pose
from rtvideo.core.session_config import GeneratorLimits


class Channel(Protocol):
    """One request's response stream: Triton's decoupled response sender, in the model."""

    def send(self, message: Mapping[str, Any] | None, data: bytes = b"", *, final: bool = False) -> None:
        """Send one response (a message, optionally with a binary payload); None = flags-only."""

    def is_cancelled(self) -> bool:
        """True once the client cancelled the stream or went away."""


class ChunkEncoder(Protocol):
    """One session's encoder: RGB chunks in, one self-contained fMP4 payload per chunk out."""

    def encode_chunk(self, frames: np.ndarray) -> bytes: ...

    def close(self) -> bytes:
        """The stream's closing bytes (the trailer; empty when there are none)."""


class EncoderFactory(Protocol):
    """(width, height, fps) → a new encoder; `options`: a start's codec options as they map onto
    it (`rtvideo.core.codec_options`), None for its defaults."""

    def __call__(self, width: int, height: int, fps: int, *, options: EncoderOptions | None = None) -> ChunkEncoder: ...


class Metrics(Protocol):
    """Counters the runtime reports; the Triton adapter maps them onto `pb_utils.MetricFamily`."""

    def set_active_sessions(self, count: int) -> None: ...

    def set_paused_sessions(self, count: int) -> None: ...

    def observe_chunk(
        self, generate_seconds: float, encode_seconds: float, frames: int, nbytes: int, fps: float
    ) -> None: ...

    def count_interaction(self, outcome: str) -> None: ...

    def observe_ack(self, seconds: float) -> None: ...

    def count_session_end(self, reason: str) -> None: ...


class NullMetrics:
    """Metrics that go nowhere, for hosts that collect none."""

    def set_active_sessions(self, count: int) -> None:
        pass

    def set_paused_sessions(self, count: int) -> None:
        pass

    def observe_chunk(
        self, generate_seconds: float, encode_seconds: float, frames: int, nbytes: int, fps: float
    ) -> None:
        pass

    def count_interaction(self, outcome: str) -> None:
        pass

    def observe_ack(self, seconds: float) -> None:
        pass

    def count_session_end(self, reason: str) -> None:
        pass


class GeneratorSession(Protocol):
    """One video stream: owns its time cursor so motion carries across chunks."""

    def generate(self, mix: Conditioning, num_frames: int, poses: Sequence[Pose] | None = None) -> np.ndarray:
        """The next `num_frames` frames, uint8 [num_frames, H, W, 3] RGB, conditioned on `mix`
        (a `{prompt: weight}` mix, or a recipe with slerp: `rtvideo.core.conditioning`). `poses`: the camera
        pose of each frame (relative to the session's start pose); None = the start pose."""
        ...

    def close(self) -> None: ...


class VideoGenerator(Protocol):
    """What the Triton backend talks to; it never sees protocol messages."""

    limits: GeneratorLimits

    def embed(self, prompt: str) -> Any:
        """The prompt's conditioning vector (cached)."""
        ...

    def open_session(
        self, *, width: int, height: int, seed: int, fps: int | None = None, image: np.ndarray | None = None
    ) -> GeneratorSession:
        """`image`: the first frame (uint8 RGB [H, W, 3], any size), or None."""
        ...
