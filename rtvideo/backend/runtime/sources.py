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
from dataclasses import dataclass, replace
from typing import Any, Protocol, cast, runtime_checkable

import numpy as np

from rtvideo.backend.runtime.ports import ChunkEncoder, EncoderFactory, GeneratorSession, VideoGenerator
from rtvideo.core import camera, conditioning
from rtvideo.core.conditioning import Conditioning
from rtvideo.core.errors import ErrorCode
from rtvideo.core.interaction.registry import HandlerRegistry
from rtvideo.core.interaction.types import BLEND, CAMERA, PROMPT, BlendPart, CameraPart, Interaction, Part, PromptPart
from rtvideo.core.pose import Pose
from rtvideo.core.rebuild import ScriptedEvent
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
    #: chunk metadata the generator gives as is: an engine that paces itself, its
    #: `output_chunk_index` and `pacing` (vLLM-Omni 0.32's `output_formatter.py`)
    stream: Mapping[str, Any] | None = None


class PlayerIdle(RuntimeError):
    """The generator ended a paced session whose player made no progress for its
    `streaming_pacing.idle_timeout_s` (0.32's "Streaming idle timeout"): `stall_timeout`."""


@runtime_checkable
class PlayerReports(Protocol):
    """A source whose generator paces itself to the player (vLLM-Omni 0.32's engine): the
    session forwards each `session.playback` position to it. Called on the request path."""

    def playback(self, position_seconds: float) -> None: ...


@dataclass(frozen=True)
class FailedEvent:
    """An acked event that will not be applied: refused at admission (`EventDesk.admit`, by
    `rtvideo.core.interaction.refusal.interaction_refusal`), or refused by the engine after it was
    forwarded (the source has dropped it from its open events). The session reports it with
    `code` and `why`."""

    event_id: str
    why: str
    code: ErrorCode = ErrorCode.INTERACTION_FAILED


class ChunkSource(Protocol):
    """One session's chunks. `admit` runs on the request path, `interrupt` on any thread,
    the rest on the session's worker.

    Every acked event the model does not refuse reaches `admit_event` (the one way in): the
    model refused beforehand what the generator does not take (`config.interactions`) or the
    engine's pipeline does not register (`config.pipeline_interactions`).
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

    def render(self, mix: Conditioning, num_frames: int, poses: Sequence[Pose] | None = None) -> RenderedChunk: ...

    def close(self) -> bytes:
        """Free the generator state; the trailer once, then b''."""


class SkippingRenderer(Renderer, Protocol):
    """A renderer that can skip frames without rendering them (a rebuild: `GeneratorChunkSource`)."""

    def skip(self, num_frames: int) -> None: ...


class LocalRenderer:
    """A generator session and its encoder in this process (a render worker runs one per session too)."""

    def __init__(self, session: GeneratorSession, open_encoder: Callable[[], ChunkEncoder]) -> None:
        self._session = session
        self._encoder = LazyEncoder(open_encoder)
        self._open = True

    def render(self, mix: Conditioning, num_frames: int, poses: Sequence[Pose] | None = None) -> RenderedChunk:
        t0 = time.perf_counter()
        if poses is None:
            frames = self._session.generate(mix, num_frames)
        else:
            frames = self._session.generate(mix, num_frames, poses)
        return self._encoder.encode(frames, time.perf_counter() - t0)

    def skip(self, num_frames: int) -> None:
        """Move the generator's time cursor over `num_frames` frames it never renders."""
        self._session.skip(num_frames)  # type: ignore[attr-defined]  # the built-in session's

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
    start pose), so a session without camera events renders exactly as before.

    `config.rebuild` (`rtvideo.core.rebuild`): its events are admitted just before their chunk's
    boundary, camera ones at their recorded frame; the chunks before its `generation_chunk_index`
    are resolved without rendering (the renderer skips their frames), and the stream starts
    there. The rebuilt history events are named by no list of this stream; its named ones (a
    moved session's own) are, as the old stream would have named them."""

    pacing = True  # the generator renders only when asked

    def __init__(self, renderer: Renderer, config: SessionConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self._renderer = renderer
        initial = config.prompt if config.prompts is None else conditioning.blend(config.prompts, config.interpolation)
        self._tracker = TransitionTracker(initial)
        self._camera = camera.CameraTracker()
        self._camera_used = False
        self._fps = float(config.fps)
        self._clock = clock
        self._lock = threading.Lock()  # admit (request path) vs next_chunk (worker)
        self._handlers = HandlerRegistry(
            {PROMPT: self._admit_prompt, BLEND: self._admit_blend, CAMERA: self._admit_camera}
        )
        self._config = config
        rebuild = config.rebuild
        self._script: dict[int, list[ScriptedEvent]] = {}
        for event in rebuild.events if rebuild is not None else ():
            self._script.setdefault(event.chunk, []).append(event)
        self._history = rebuild.history_ids if rebuild is not None else frozenset()
        self._skip_to = rebuild.generation_chunk_index if rebuild is not None else 0
        self._skipped_frames = 0  # frames resolved without rendering, not yet skipped by the renderer
        self._next_index = 0  # the generation chunk of the next boundary
        self._forced_frame: int | None = None  # while a scripted camera event is admitted

    def admit_event(self, interaction: Interaction) -> None:
        """Every part of one event (parsed with its message, before its ack), under one lock
        so a boundary sees all of it or none."""
        with self._lock:
            self._fast_forward()  # a rebuilt state, and its events due next, come before any live event
            self._handlers.admit(interaction)

    def _admit_due(self) -> None:
        """The scripted events of the next boundary, in the order received (call holding the lock)."""
        for event in self._script.pop(self._next_index, ()):
            interaction = Interaction.admitted(
                event.request,
                event.event_id,
                prompt_default=self._config.default_transition_chunks,
                received_at=float(self._next_index),
                interpolation_default=self._config.interpolation,
            )
            self._forced_frame = event.frame_offset
            try:
                self._handlers.admit(interaction)
            finally:
                self._forced_frame = None

    def _fast_forward(self) -> None:
        """Resolve the chunks before the rebuild's target without rendering (call holding the lock)."""
        frames = self._config.frames_per_chunk
        while self._next_index < self._skip_to:
            self._admit_due()
            self._tracker.next_chunk()
            self._camera.next_chunk(frames, self._fps, None)
            self._next_index += 1
            self._skipped_frames += frames
        self._admit_due()

    def _admit_prompt(self, interaction: Interaction, part: Part) -> None:
        assert isinstance(part, PromptPart)
        self._tracker.admit(interaction.event_id, part.text, interaction.chunks[PROMPT], interaction.interpolation)

    def _admit_blend(self, interaction: Interaction, part: Part) -> None:
        """A blend takes the prompt's slot: the same tracker, so either supersedes the other."""
        assert isinstance(part, BlendPart)
        method = interaction.interpolation
        target = conditioning.blend(part.prompts, method)
        self._tracker.admit(interaction.event_id, target, interaction.chunks[BLEND], method)

    def _admit_camera(self, interaction: Interaction, part: Part) -> None:
        assert isinstance(part, CameraPart)
        self._camera_used = True
        self._camera.admit(
            interaction.event_id,
            part.command,
            interaction.chunks[CAMERA],
            interaction.received_at,
            frame=self._forced_frame,
        )

    def next_chunk(self, max_frames: int) -> SourceChunk:
        with self._lock:
            self._fast_forward()
            skipped, self._skipped_frames = self._skipped_frames, 0
            plan = self._tracker.next_chunk()
            self._next_index += 1
            # every boundary, as vLLM-Omni applies its (non-lazy) camera handler from chunk 0:
            # an event's frame is its receipt time since the previous boundary
            shot = self._camera.next_chunk(max_frames, self._fps, self._clock())
            poses: tuple[Pose, ...] | None = None
            if self._camera_used:
                poses = shot.poses
                plan = merge_camera(plan, shot)
            if self._history:
                plan = without_events(plan, self._history)
        if skipped:
            cast(SkippingRenderer, self._renderer).skip(skipped)
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
        frame_offsets={**plan.frame_offsets, **shot.frame_offsets},
    )


def without_events(plan: ChunkPlan, history: frozenset[str]) -> ChunkPlan:
    """A plan whose lists leave out a rebuild's events: they are history, never acked on this
    stream (its mix, the render, keeps their effect)."""

    def keep(ids: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(event_id for event_id in ids if event_id not in history)

    return replace(
        plan,
        started=keep(plan.started),
        active=keep(plan.active),
        completed=keep(plan.completed),
        superseded=keep(plan.superseded),
        interrupted=keep(plan.interrupted),
        progress={k: v for k, v in plan.progress.items() if k not in history},
        frame_offsets={k: v for k, v in plan.frame_offsets.items() if k not in history},
    )


class GeneratorSources:
    """`ChunkSourceFactory` over a `VideoGenerator` in this process (the built-in one, or a test's stand-in)."""

    #: its sources take a start's `rebuild` (docs/triton-model.md "Rebuilding a session")
    rebuilds = True

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
