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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np

from rtvideo.backend.runtime.ports import ChunkEncoder, EncoderFactory, GeneratorSession, VideoGenerator
from rtvideo.core import camera
from rtvideo.core.pose import Pose
from rtvideo.core.protocol import InteractionRequest
from rtvideo.core.session_config import SessionConfig
from rtvideo.core.transitions import ChunkPlan, TransitionTracker


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


@dataclass(frozen=True)
class Interaction:
    """An acked event, as every source receives it (`ChunkSource.admit_event`).

    `prompt_chunks` is the prompt part's N, resolved by the session's config; the other
    modalities resolve `transition_chunks` (as the client sent it, or None) themselves (the
    camera's default is 1, as vLLM-Omni's). `received_at` (monotonic) places the event in
    its chunk (`rtvideo.core.camera.frame_offset`); `event` is the event as validated, for an
    engine that takes it unchanged."""

    event_id: str
    event: Mapping[str, Any]
    prompt_chunks: int
    transition_chunks: int | None
    received_at: float
    multi_modal_data: Mapping[str, Any] = field(default_factory=dict)
    #: the camera part, parsed once with the message (`InteractionRequest.camera`), or None
    camera: camera.CameraCommand | None = None

    @property
    def prompt(self) -> str | None:
        value = self.event.get("prompt")
        return value if isinstance(value, str) else None

    @classmethod
    def from_request(
        cls, request: InteractionRequest, event_id: str, prompt_chunks: int, received_at: float
    ) -> Interaction:
        """The acked `session.interaction` as a source receives it (`prompt_chunks`: its prompt's
        N, resolved by the session's config)."""
        return cls(
            event_id=event_id,
            event=request.event,
            prompt_chunks=prompt_chunks,
            transition_chunks=request.transition_chunks,
            received_at=received_at,
            multi_modal_data=dict(request.event.get("multi_modal_data") or {}),
            camera=request.camera,
        )

    @classmethod
    def prompt_update(cls, event_id: str, prompt: str, chunks: int, received_at: float = 0.0) -> Interaction:
        """A prompt-only event with its N resolved (what most callers outside a session admit)."""
        return cls(event_id, {"prompt": prompt}, chunks, chunks, received_at)


#: what a source applies when it does not say (`ChunkSource.modalities`)
PROMPT_ONLY: frozenset[str] = frozenset({"prompt"})


def event_modalities(event: Mapping[str, Any]) -> list[str]:
    """An event's parts in vLLM-Omni's order (`DiffusionModelRunner.submit_interaction`):
    the prompt first, then each `multi_modal_data` key."""
    parts = ["prompt"] if event.get("prompt") is not None else []
    return parts + [str(modality) for modality in event.get("multi_modal_data") or {}]


def source_modalities(source: object) -> frozenset[str] | None:
    """The modalities a source applies: its `modalities` attribute (None: whatever the engine
    accepts, unknown here), else the prompt only."""
    return getattr(source, "modalities", PROMPT_ONLY)


class ChunkSource(Protocol):
    """One session's chunks. `admit` runs on the request path, `interrupt` on any thread,
    the rest on the session's worker.

    Every acked event reaches `admit_event` (the one way in). A source that applies more than
    prompts says so with `modalities` (a frozenset, or None when only its engine knows); one
    without gets prompt-only events.
    """

    #: whether waiting before `next_chunk` holds generation back (then the session paces it)
    pacing: bool

    def admit_event(self, interaction: Interaction) -> None:
        """An acked event (its prompt's N resolved); it takes effect at a later boundary."""

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

    def render(
        self, mix: Mapping[str, float], num_frames: int, poses: Sequence[Pose] | None = None
    ) -> RenderedChunk: ...

    def close(self) -> bytes:
        """Free the generator state; the trailer once, then b''."""


class LocalRenderer:
    """A generator session and its encoder in this process (a render worker runs one per session too)."""

    def __init__(self, session: GeneratorSession, open_encoder: Callable[[], ChunkEncoder]) -> None:
        self._session = session
        self._encoder = LazyEncoder(open_encoder)
        self._open = True

    def render(self, mix: Mapping[str, float], num_frames: int, poses: Sequence[Pose] | None = None) -> RenderedChunk:
        t0 = time.perf_counter()
        if poses is None:
            frames = self._session.generate(mix, num_frames)
        else:
            frames = self._session.generate(mix, num_frames, poses)
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
    """The built-in path: the trackers resolve each boundary (the prompt mix, and the camera's
    pose per frame), the renderer renders and encodes them. The trackers stay in this process
    wherever rendering happens: they decide what the acks promise.

    Both interaction kinds of vLLM-Omni 0.30 apply here, alone or in one event; a chunk's event
    lists are the two trackers' merged as vLLM-Omni's `merge_interaction_metadata` merges its
    handlers' (prompt first). Until a camera event arrives the renderer gets no poses (the
    start pose), so a session without camera events renders exactly as before."""

    pacing = True  # the generator renders only when asked
    modalities = frozenset({"prompt", camera.MODALITY})

    def __init__(self, renderer: Renderer, config: SessionConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self._renderer = renderer
        self._tracker = TransitionTracker(config.prompt)
        self._camera = camera.CameraTracker()
        self._camera_used = False
        self._fps = float(config.fps)
        self._clock = clock
        self._lock = threading.Lock()  # admit (request path) vs next_chunk (worker)

    def admit_event(self, interaction: Interaction) -> None:
        """Every part of one event (parsed with its message, before its ack)."""
        command = interaction.camera
        with self._lock:
            if interaction.prompt is not None:
                self._tracker.admit(interaction.event_id, interaction.prompt, interaction.prompt_chunks)
            if command is not None:
                self._camera_used = True
                self._camera.admit(
                    interaction.event_id, command, interaction.transition_chunks, interaction.received_at
                )

    def next_chunk(self, max_frames: int) -> SourceChunk:
        with self._lock:
            plan = self._tracker.next_chunk()
            # every boundary, as vLLM-Omni applies its (non-lazy) camera handler from chunk 0:
            # an event's frame is its receipt time since the previous boundary
            shot = self._camera.next_chunk(max_frames, self._fps, self._clock())
            poses: tuple[Pose, ...] | None = None
            if self._camera_used:
                poses = shot.poses
                plan = merge_camera(plan, shot)
        return SourceChunk(plan, self._renderer.render(plan.mix, max_frames, poses))

    def interrupt(self) -> None:
        pass  # nothing waits here: a render in progress finishes

    def close(self) -> bytes:
        return self._renderer.close()


def merge_camera(plan: ChunkPlan, shot: camera.CameraChunk) -> ChunkPlan:
    """A prompt plan with the camera's lists merged in (prompt first, each id once, as
    `merge_interaction_metadata`); `transition_progress` covers every active id."""
    progress = dict(plan.progress)
    for event_id, value in shot.progress.items():
        progress.setdefault(event_id, value)
    return replace(
        plan,
        started=camera.merge_ids(plan.started, shot.started),
        active=camera.merge_ids(plan.active, shot.active),
        completed=camera.merge_ids(plan.completed, shot.completed),
        progress=progress,
    )


class GeneratorSources:
    """`ChunkSourceFactory` over a `VideoGenerator` in this process (the built-in one, or a test's stand-in)."""

    def __init__(self, generator: VideoGenerator, encoder_factory: EncoderFactory) -> None:
        self.generator = generator
        self._encoder_factory = encoder_factory

    def open(self, config: SessionConfig, request_id: str) -> GeneratorChunkSource:
        # only with an image_reference: a test's stand-in generator need not take `image`
        image = {} if config.reference_image is None else {"image": config.reference_image}
        session = self.generator.open_session(
            width=config.width, height=config.height, seed=config.seed, fps=config.fps, **image
        )
        open_encoder = functools.partial(self._encoder_factory, config.width, config.height, config.fps)
        return GeneratorChunkSource(LocalRenderer(session, open_encoder), config)

    def close(self) -> None:
        pass
