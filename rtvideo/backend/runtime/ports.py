"""What the session runtime needs from its host (Triton or a test harness), as protocols."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np


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


#: (width, height, fps) → a new encoder
EncoderFactory = Callable[[int, int, int], ChunkEncoder]


class Metrics(Protocol):
    """Counters the runtime reports; the Triton adapter maps them onto `pb_utils.MetricFamily`."""

    def set_active_sessions(self, count: int) -> None: ...

    def set_paused_sessions(self, count: int) -> None: ...

    def observe_chunk(self, generate_seconds: float, encode_seconds: float, frames: int, nbytes: int) -> None: ...

    def count_interaction(self, outcome: str) -> None: ...

    def observe_ack(self, seconds: float) -> None: ...

    def count_session_end(self, reason: str) -> None: ...


class NullMetrics:
    """Metrics that go nowhere, for hosts that collect none."""

    def set_active_sessions(self, count: int) -> None:
        pass

    def set_paused_sessions(self, count: int) -> None:
        pass

    def observe_chunk(self, generate_seconds: float, encode_seconds: float, frames: int, nbytes: int) -> None:
        pass

    def count_interaction(self, outcome: str) -> None:
        pass

    def observe_ack(self, seconds: float) -> None:
        pass

    def count_session_end(self, reason: str) -> None:
        pass
