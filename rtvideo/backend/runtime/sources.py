"""Chunk sources: where a session's encoded chunks, and the events they report, come from.

`Session` streams, paces and ends a session the same way whatever the generator is; a
source decides what each chunk shows and hands it over encoded:

- `GeneratorChunkSource` (the built-in generator): our `TransitionTracker` resolves each
  boundary into a prompt mix, and a `Renderer` renders exactly that mix and encodes it:
  a `LocalRenderer` in this process (`render_workers 0`), or a render worker's session
  (`rtvideo.backend.builtin.render_pool`), which runs a `LocalRenderer` in the worker;
- `rtvideo.backend.vllm_omni.source.EngineChunkSource`: the engine applies interactions at its
  own boundaries; its stream metadata is translated into the same plans
  (`rtvideo.core.stream_translation`) and its frames are encoded by a `LazyEncoder`.

Invariants: every chunk a source returns is encoded (the session never sees frames); a
source's `close()` returns its encoder's closing bytes (the trailer) once; an encoder
opens at its session's first chunk, on the session's worker thread, never on the request
path (opening a codec takes milliseconds that every session's acks would wait for).
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from rtvideo.backend.runtime.ports import ChunkEncoder, EncoderFactory
from rtvideo.core.session_config import SessionConfig
from rtvideo.core.transitions import ChunkPlan, TransitionTracker

if TYPE_CHECKING:
    from rtvideo.backend.builtin.generator import GeneratorSession, VideoGenerator


@dataclass(frozen=True)
class RenderedChunk:
    """One chunk's frames, encoded: the fMP4 payload, how many frames it holds, and where the time went."""

    payload: bytes
    frames: int
    generate_seconds: float
    encode_seconds: float


@dataclass(frozen=True)
class SourceChunk:
    """One generation chunk as the session sends it: the plan (the events its metadata
    reports) and the encoded media."""

    plan: ChunkPlan
    media: RenderedChunk


@dataclass(frozen=True)
class FailedEvent:
    """An acked event the source could not apply (the engine refused it). The source has
    dropped it from its open events; the session reports it with `interaction_failed`."""

    event_id: str
    why: str


class ChunkSource(Protocol):
    """One session's chunks. `admit` runs on the request path, `interrupt` on any thread,
    the rest on the session's worker."""

    #: whether waiting before `next_chunk` holds generation back (then the session paces it)
    pacing: bool

    def admit(self, event_id: str, prompt: str, transition_chunks: int) -> None:
        """An acked prompt update (N resolved); it takes effect at a later boundary."""

    def next_chunk(self, max_frames: int) -> SourceChunk | FailedEvent | None:
        """The next chunk, of `max_frames` frames (a source with chunks of its own size: at
        most the session's frames left), or an event that failed since the last call. None
        when `interrupt()` woke the wait. Raises when generation failed."""

    def interrupt(self) -> None:
        """Wake a `next_chunk` waiting for the generator: the session ended or its stream was
        cancelled. A source that never waits (it renders when asked) ignores it."""

    def close(self) -> bytes:
        """Free the generator state (or end the engine request); safe to call more than once.
        Returns the encoder's closing bytes (the trailer) once, else b''."""


class ChunkSourceFactory(Protocol):
    """Opens one source per session (`SessionManager` calls it at each start, under its lock:
    nothing slow may happen here)."""

    def open(self, config: SessionConfig, request_id: str) -> ChunkSource: ...

    def close(self) -> None:
        """Release what the sources share (the model unloads)."""


class LazyEncoder:
    """One session's encoder, opened at its first chunk (see the module docstring)."""

    def __init__(self, open_encoder: Callable[[], ChunkEncoder]) -> None:
        self._open_encoder = open_encoder
        self._encoder: ChunkEncoder | None = None
        self._closed = False

    def encode(self, frames: np.ndarray, generate_seconds: float) -> RenderedChunk:
        if self._encoder is None:
            if self._closed:
                raise RuntimeError("the encoder is closed")
            self._encoder = self._open_encoder()
        t0 = time.perf_counter()
        payload = self._encoder.encode_chunk(frames)
        return RenderedChunk(payload, len(frames), generate_seconds, time.perf_counter() - t0)

    def close(self) -> bytes:
        """The trailer (b'' when nothing was encoded); later calls return b''."""
        self._closed = True
        encoder, self._encoder = self._encoder, None
        return encoder.close() if encoder is not None else b""


class Renderer(Protocol):
    """Renders and encodes one session's chunks: a `LocalRenderer`, or a render worker's session."""

    def render(self, mix: Mapping[str, float], num_frames: int) -> RenderedChunk: ...

    def close(self) -> bytes:
        """Free the generator state; the trailer once, then b''."""


class LocalRenderer:
    """A generator session and its encoder in this process (a render worker runs one per session too)."""

    def __init__(self, session: GeneratorSession, open_encoder: Callable[[], ChunkEncoder]) -> None:
        self._session = session
        self._encoder = LazyEncoder(open_encoder)
        self._open = True

    def render(self, mix: Mapping[str, float], num_frames: int) -> RenderedChunk:
        t0 = time.perf_counter()
        frames = self._session.generate(mix, num_frames)
        return self._encoder.encode(frames, time.perf_counter() - t0)

    def close(self) -> bytes:
        if not self._open:
            return b""
        self._open = False
        try:
            return self._encoder.close()
        finally:
            self._session.close()


class GeneratorChunkSource:
    """The built-in path: the tracker resolves each boundary, the renderer renders and encodes its mix.
    The tracker stays in this process wherever rendering happens: it decides what the acks promise."""

    pacing = True  # the generator renders only when asked

    def __init__(self, renderer: Renderer, config: SessionConfig) -> None:
        self._renderer = renderer
        self._tracker = TransitionTracker(config.prompt)
        self._lock = threading.Lock()  # admit (request path) vs next_chunk (worker)

    def admit(self, event_id: str, prompt: str, transition_chunks: int) -> None:
        with self._lock:
            self._tracker.admit(event_id, prompt, transition_chunks)

    def next_chunk(self, max_frames: int) -> SourceChunk:
        with self._lock:
            plan = self._tracker.next_chunk()
        return SourceChunk(plan, self._renderer.render(plan.mix, max_frames))

    def interrupt(self) -> None:
        pass  # nothing waits here: a render in progress finishes

    def close(self) -> bytes:
        return self._renderer.close()


class GeneratorSources:
    """`ChunkSourceFactory` over a `VideoGenerator` in this process (the built-in one, or a test's stand-in)."""

    def __init__(self, generator: VideoGenerator, encoder_factory: EncoderFactory) -> None:
        self.generator = generator
        self._encoder_factory = encoder_factory

    def open(self, config: SessionConfig, request_id: str) -> GeneratorChunkSource:
        session = self.generator.open_session(
            width=config.width, height=config.height, seed=config.seed, fps=config.fps
        )
        open_encoder = functools.partial(self._encoder_factory, config.width, config.height, config.fps)
        return GeneratorChunkSource(LocalRenderer(session, open_encoder), config)

    def close(self) -> None:
        pass
