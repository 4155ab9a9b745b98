"""Chunk sources: where a session's chunks, and the events they report, come from.

`Session` streams, paces, encodes and ends a session the same way whatever the
generator is; what differs is who resolves transition boundaries:

- `GeneratorChunkSource` (the built-in generator): our `TransitionTracker` resolves each
  boundary into a prompt mix, and the generator renders exactly that mix;
- `rtvideo.backend.vllm_omni.source.EngineChunkSource`: the engine applies interactions at its
  own boundaries; its stream metadata is translated into the same plans
  (`rtvideo.core.stream_translation`).

Either way every admitted event reaches exactly one end (docs/protocol.md §5).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from rtvideo.core.session_config import SessionConfig
from rtvideo.core.transitions import ChunkPlan, Outcome, TransitionTracker

if TYPE_CHECKING:
    from rtvideo.backend.builtin.generator import VideoGenerator


@dataclass(frozen=True)
class SourceChunk:
    """One generation chunk: its frames (uint8 [T, H, W, 3] RGB), its plan, and how long it took.

    A source that also encodes (render workers: `rtvideo.backend.builtin.render_pool`) gives the
    fMP4 `payload` of its `num_frames` frames instead of the frames."""

    plan: ChunkPlan
    frames: np.ndarray | None
    generate_seconds: float
    payload: bytes | None = None
    num_frames: int = 0
    encode_seconds: float = 0.0


#: an event the source could not apply after its ack: (event_id, why, forget); the session
#: reports it with `interaction_failed` and calls `forget` to drop it from the open events
EventFailed = Callable[[str, str, Callable[[], None]], None]


class ChunkSource(Protocol):
    """One session's chunks. `admit` runs on the request path, the rest on the session's worker."""

    #: whether waiting before `next_chunk` holds generation back (then the session paces it)
    pacing: bool

    def admit(self, event_id: str, prompt: str, transition_chunks: int | None) -> None:
        """An acked prompt update; it takes effect at a later boundary."""

    def next_chunk(self, max_frames: int, interrupted: Callable[[], bool]) -> SourceChunk | None:
        """The next chunk, at most `max_frames` frames; None when `interrupted()` turned true
        while waiting (the caller re-checks why). Raises when generation failed."""

    def finish(self) -> Outcome:
        """Events that reached no end on a chunk (called once, when the session ends)."""

    def close(self) -> bytes:
        """Free the generator state (or end the engine request); safe to call more than once.
        A source that encodes returns its encoder's closing bytes (the trailer) once, else b''."""


class ChunkSourceFactory(Protocol):
    """Opens one source per session (`SessionManager` calls it at each start)."""

    #: whether its sources encode their chunks themselves (then the session has no encoder)
    encodes: bool

    def open(self, config: SessionConfig, request_id: str, on_event_failed: EventFailed) -> ChunkSource: ...

    def close(self) -> None:
        """Release what the sources share (the model unloads)."""


class GeneratorChunkSource:
    """The built-in path: the tracker resolves each boundary, the generator renders its mix."""

    pacing = True  # the generator renders only when asked

    def __init__(self, generator: VideoGenerator, config: SessionConfig) -> None:
        self._session = generator.open_session(
            width=config.width, height=config.height, seed=config.seed, fps=config.fps
        )
        self._tracker = TransitionTracker(config.prompt, config.default_transition_chunks)
        self._lock = threading.Lock()  # admit (request path) vs next_chunk (worker)

    def admit(self, event_id: str, prompt: str, transition_chunks: int | None) -> None:
        with self._lock:
            self._tracker.admit(event_id, prompt, transition_chunks)

    def next_chunk(self, max_frames: int, interrupted: Callable[[], bool]) -> SourceChunk:
        with self._lock:
            plan = self._tracker.next_chunk()
        t0 = time.perf_counter()
        frames = self._session.generate(plan.mix, max_frames)
        return SourceChunk(plan, frames, time.perf_counter() - t0)

    def finish(self) -> Outcome:
        with self._lock:
            return self._tracker.finish()

    def close(self) -> bytes:
        self._session.close()
        return b""


class GeneratorSources:
    """`ChunkSourceFactory` over a `VideoGenerator` (the built-in one, or a test's stand-in)."""

    encodes = False

    def __init__(self, generator: VideoGenerator) -> None:
        self.generator = generator

    def open(self, config: SessionConfig, request_id: str, on_event_failed: EventFailed) -> GeneratorChunkSource:
        return GeneratorChunkSource(self.generator, config)

    def close(self) -> None:
        pass
