"""A session's chunks from the hosted engine: forwarding interactions, translating its stream
metadata into chunk plans, and encoding its frames.

Everything for one session arrives on one queue, filled by the engine's loop and by
interaction futures (outputs, refusals, the stream's end or error) and by `interrupt()`;
the session's worker takes from it, so every wait wakes on what it waits for.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from rtvideo.backend.runtime.ports import ChunkEncoder, EncoderFactory
from rtvideo.backend.runtime.sources import FailedEvent, Interaction, LazyEncoder, PlayerIdle, SourceChunk
from rtvideo.backend.vllm_omni.engine import EngineError, EngineHost, EngineRequest
from rtvideo.backend.vllm_omni.frames import output_video, rgb_frames, stream_metadata
from rtvideo.backend.vllm_omni.model_rules import FirstFrameAt, ModelRules
from rtvideo.backend.vllm_omni.output_queue import DEFAULT_OUTPUT_QUEUE_BYTES, OVERFLOW, OutputQueue
from rtvideo.backend.vllm_omni.presets import DEFAULT_MAX_REQUEST_FRAMES
from rtvideo.core.camera import CameraMode, chunk_lists, merge_ids
from rtvideo.core.interaction.types import PROMPT
from rtvideo.core.session_config import SessionConfig
from rtvideo.core.stream_translation import ACTIVE, COMPLETED, STARTED, EngineStreamTranslator
from rtvideo.core.streaming_pacing import OUTPUT_CHUNK_INDEX, PACING
from rtvideo.core.transitions import ChunkPlan

log = logging.getLogger(__name__)

#: how vLLM-Omni 0.32 words the end of a paced request whose player made no progress
#: (`diffusion_engine.py`): our `stall_timeout`
ENGINE_IDLE_ERROR = "Streaming idle timeout"


class EngineChunkSource:
    """A session's chunks from the engine: its outputs, with its stream metadata translated."""

    #: waiting before `next_chunk` does not slow the engine down, so the session does not pace;
    #: an engine that paces itself (0.32) is told the player's position instead (`playback`)
    pacing = False

    def __init__(
        self,
        host: EngineHost,
        config: SessionConfig,
        request_id: str,
        num_frames: int,
        preset: Mapping[str, Any],
        open_encoder: Callable[[], ChunkEncoder],
        image_at: FirstFrameAt = FirstFrameAt.PROMPT,
        output_queue_bytes: int = DEFAULT_OUTPUT_QUEUE_BYTES,
        *,
        drop_first_frame: bool = False,
    ) -> None:
        """`drop_first_frame`: the engine's first frame is the viewer's last one again (a
        continuation on a model that `repeats_first_frame`): not shown twice."""
        self._host = host
        self._drop_first = drop_first_frame
        self._unstarted: list[str] = []  # forwarded, not yet started, superseded or refused
        self._config = config
        self._request_id = request_id
        self._translator = EngineStreamTranslator()
        # events without a prompt (camera only): the engine's own lists, passed through (`_camera_plan`)
        self._passthrough: dict[str, _PassThrough] = {}
        self._running: tuple[str, ...] = ()  # pass-through events running at the last chunk's end
        self._closed = False
        self._lock = threading.Lock()  # translator + forwarding (request path vs worker)
        self._queue = OutputQueue(output_queue_bytes)
        #: the largest `peak_memory_mb` the engine's outputs reported (0: none did); logged at close
        self._peak_memory_mb = 0.0
        self._encoder = LazyEncoder(open_encoder)
        # the engine renders whole chunks: its last one may run past a bounded session's frames
        self._frames_left = config.num_frames
        self._last = time.monotonic()
        # an approximate rebuild (rtvideo.core.rebuild): chunks numbered from N on, and the
        # session's events in progress at the cut listed completed in the first chunk
        rebuild = config.rebuild
        self._first_index = rebuild.generation_chunk_index if rebuild is not None else 0
        self._cut_open = tuple(e.event_id for e in rebuild.named if e.open) if rebuild is not None else ()
        prompt = {"prompt": config.prompt}
        # set only where the engine paces (the model's capabilities say so: `EngineHost.paces`)
        self._paced = config.streaming_pacing is not None
        host.start_request(
            EngineRequest(
                request_id, prompt, config, num_frames, preset, self._queue, image_at, config.streaming_pacing
            )
        )

    def playback(self, position_seconds: float) -> None:
        """A paced session's player position, for the engine that paces it (`PlayerReports`)."""
        if self._paced:
            self._host.playback(self._request_id, position_seconds)

    def admit_event(self, interaction: Interaction) -> None:
        """An event the model did not refuse (what the pipeline does not register never gets here:
        `rtvideo.core.interaction.refusal.interaction_refusal`), forwarded as sent (`multi_modal_data`
        unchanged); what the engine still refuses comes back as `event_failed`. One with a prompt is
        translated as a prompt update (its N resolved); one without (a camera command) keeps
        the engine's own lists."""
        event_id = interaction.event_id
        with self._lock:
            if interaction.prompt is not None:
                self._translator.admit(event_id, interaction.prompt_chunks)
            else:
                command = interaction.camera
                held = command is not None and command.mode is CameraMode.VELOCITY
                self._passthrough[event_id] = _PassThrough(held, interaction.chunks[interaction.kinds[0]])
            # at once: the host holds it, in order, until the engine can take interactions
            self._forward(interaction)

    def _forward(self, held: Interaction) -> None:
        """Hand one event to the engine (under the lock, so forwards keep admission order)."""
        event_id = held.event_id
        if event_id not in self._passthrough:
            self._translator.forwarded(event_id)
        event = held.event
        # with a prompt, its N as resolved here (the session's default, not the engine's); without
        # one, as sent: absent, the engine applies its handler's default
        n = held.prompt_chunks if PROMPT in held.chunks else held.transition_chunks
        prompt = held.prompt
        interaction: dict[str, Any]
        if held.kinds == (PROMPT,):  # a prompt update: the shape every engine takes
            interaction = {"event_id": event_id, "event": {"prompt": prompt}, "transition_chunks": n}
        else:  # the event unchanged
            interaction = {"event_id": event_id, "event": dict(event)}
            if n is not None:
                interaction["transition_chunks"] = n
        self._unstarted.append(event_id)
        try:
            future = self._host.interact(self._request_id, interaction)
        except Exception as exc:  # noqa: BLE001 - reported like a refusal
            self._queue.put("event_failed", (event_id, exc), time.monotonic())
            return

        def done(f: concurrent.futures.Future[Any]) -> None:
            exc = None if f.cancelled() else f.exception()
            if exc is not None or f.cancelled():
                self._queue.put("event_failed", (event_id, exc), time.monotonic())

        future.add_done_callback(done)

    def next_chunk(self, max_frames: int) -> SourceChunk | FailedEvent | None:
        """The engine's next output (its own chunk size; `max_frames` is not used), a refused
        event, or None when `interrupt()` came first."""
        kind, value, at = self._queue.get()
        if kind == "interrupt":
            return None
        if kind == "event_failed":
            event_id, exc = value
            with self._lock:
                self._translator.failed(event_id)  # it never starts: no later chunk may name it
                if event_id in self._unstarted:
                    self._unstarted.remove(event_id)
            return FailedEvent(event_id, f"the engine refused the interaction: {exc}")
        if kind == "error":
            # an interaction the engine refuses after queueing it comes back this way too (the
            # request is aborted): name the events it may be about
            with self._lock:
                pending = list(self._unstarted)
            about = f" (with event(s) {', '.join(map(repr, pending))} not yet started)" if pending else ""
            if ENGINE_IDLE_ERROR in str(value):
                raise PlayerIdle(f"the engine ended the paced request: {value}") from value
            raise EngineError(f"the engine failed{about}: {type(value).__name__}: {value}") from value
        if kind == "end":
            raise EngineError("the engine ended the stream before the session's last frame")
        if kind == OVERFLOW:  # over `vllm_omni_output_queue_bytes`: the engine request is aborted
            raise EngineError(value)
        return self._chunk(value, at)

    def interrupt(self) -> None:
        self._queue.put("interrupt", None, time.monotonic())

    def _chunk(self, output: Any, at: float) -> SourceChunk:
        error = getattr(output, "error", None)
        if error:
            if ENGINE_IDLE_ERROR in str(error):
                raise PlayerIdle(f"the engine ended the paced request: {error}")
            raise EngineError(f"the engine reported: {error}")
        frames = rgb_frames(output_video(output))
        if self._drop_first:
            self._drop_first, frames = False, frames[1:]
        if frames.shape[1:3] != (self._config.height, self._config.width):
            raise EngineError(
                f"the engine produced {frames.shape[2]}x{frames.shape[1]} frames, "
                f"the session is {self._config.width}x{self._config.height}"
            )
        stream = stream_metadata(output)
        with self._lock:
            plan = self._closing_cut(self._plan(stream))
            for event_id in (*plan.started, *plan.superseded):
                if event_id in self._unstarted:
                    self._unstarted.remove(event_id)
        if self._frames_left is not None:
            frames = frames[: self._frames_left]
            self._frames_left -= len(frames)
        seconds, self._last = at - self._last, at
        peak = getattr(output, "peak_memory_mb", None)
        if isinstance(peak, (int, float)) and not isinstance(peak, bool):
            self._peak_memory_mb = max(self._peak_memory_mb, float(peak))
        # a paced request's figures, as the engine gives them (0.32's endpoint passes them through)
        paced = {key: stream[key] for key in (OUTPUT_CHUNK_INDEX, PACING) if stream and key in stream}
        return SourceChunk(plan, self._encoder.encode(frames, seconds), paced or None)

    def _plan(self, stream: Mapping[str, Any] | None) -> ChunkPlan:
        """The translator's plan for the prompt events, with the pass-through events' lists as the
        engine gave them merged in (`merge_interaction_metadata`'s order: prompt first)."""
        if not self._passthrough:
            return self._translator.chunk(stream)
        stream = stream or {}
        mine = {
            key: [e for e in stream.get(key) or () if e in self._passthrough] for key in (STARTED, ACTIVE, COMPLETED)
        }
        rest = {**stream, **{key: [e for e in stream.get(key) or () if e not in self._passthrough] for key in mine}}
        plan = self._translator.chunk(rest)
        running = [e for e in merge_ids(mine[STARTED], mine[ACTIVE]) if e not in mine[COMPLETED]]
        progress = dict(plan.progress)
        for event_id in running:
            progress[event_id] = self._passthrough[event_id].step()
        for event_id in mine[COMPLETED]:
            progress[event_id] = 1.0  # reached, or replaced: no part of it is still to come
            self._passthrough.pop(event_id, None)
        # the engine lists as active only what runs at the chunk's end; the protocol, every event
        # contributing to the chunk (`camera.chunk_lists`)
        started, active, completed = chunk_lists(self._running, mine[STARTED], mine[COMPLETED], running)
        self._running = tuple(running)
        return ChunkPlan(
            generation_chunk_index=plan.generation_chunk_index,
            mix=plan.mix,
            started=merge_ids(plan.started, started),
            active=merge_ids(plan.active, active),
            completed=merge_ids(plan.completed, completed),
            superseded=plan.superseded,
            interrupted=plan.interrupted,
            progress=progress,
        )

    def _closing_cut(self, plan: ChunkPlan) -> ChunkPlan:
        """`plan` numbered from the rebuild's N; the first one also completes the events in
        progress at the cut (their effect is in the first frame, or ended with it)."""
        opened, self._cut_open = self._cut_open, ()
        return dataclasses.replace(
            plan,
            generation_chunk_index=plan.generation_chunk_index + self._first_index,
            active=merge_ids(opened, plan.active),
            completed=merge_ids(opened, plan.completed),
            progress={**dict.fromkeys(opened, 1.0), **plan.progress},
        )

    def close(self) -> bytes:
        with self._lock:
            if self._closed:
                return b""
            self._closed = True
        self._host.end_request(self._request_id)
        if self._peak_memory_mb > 0:
            # what the engine's runner measured for this request (vLLM-Omni's `peak_memory_mb`: its
            # worker's torch max_memory_reserved since the request began); the GPU check reads it
            log.info(
                "engine request %s: GPU memory peak %.0f MiB (%dx%d, %s frames)",
                self._request_id,
                self._peak_memory_mb,
                self._config.width,
                self._config.height,
                self._config.num_frames,
            )
        return self._encoder.close()


class _PassThrough:
    """An event the engine reports by itself (a camera command): how far along it is, for
    `transition_progress` (a held velocity: 1.0; a target: its chunks active over its N)."""

    def __init__(self, held: bool, chunks: int) -> None:
        self.held = held
        self.chunks = chunks  # resolved (`rtvideo.core.interaction.types.resolve_chunks`)
        self.elapsed = 0

    def step(self) -> float:
        self.elapsed += 1
        if self.held or self.chunks <= 0:
            return 1.0
        return min(1.0, self.elapsed / self.chunks)


class EngineSources:
    """`ChunkSourceFactory` of the `vllm_omni` generator: one engine request per session."""

    #: a `rebuild` is taken as the approximation it comes with (rtvideo.core.approximation)
    approximates = True

    def __init__(
        self,
        host: EngineHost,
        preset: Mapping[str, Any],
        max_session_seconds: float,
        encoder_factory: EncoderFactory,
        max_request_frames: int = DEFAULT_MAX_REQUEST_FRAMES,
        rules: ModelRules | None = None,
        output_queue_bytes: int = DEFAULT_OUTPUT_QUEUE_BYTES,
    ) -> None:
        self.host = host
        #: what one session's engine outputs may hold while its worker encodes (`OutputQueue`)
        self.output_queue_bytes = output_queue_bytes
        #: the model's own rules (`model_rules.py`): its frame-count rule, where it reads a first frame
        self.rules = rules
        #: the longest engine request (`vllm_omni_max_request_frames`): its decoded frames stay on the GPU
        self.max_request_frames = max_request_frames
        self._preset = dict(preset)
        self._max_session_seconds = max_session_seconds
        self._encoder_factory = encoder_factory

    def open(self, config: SessionConfig, request_id: str) -> EngineChunkSource:
        if self.host.dead is not None:
            raise EngineError(f"the engine is not healthy: {self.host.dead}")
        # the start's `extra_params.video_codec_options` apply to our encoder; the engine is not sent them
        # (a start without them opens the encoder as before: a factory need not take `options`)
        options = {"options": config.encoder_options} if config.encoder_options else {}
        open_encoder = functools.partial(self._encoder_factory, config.width, config.height, config.fps, **options)
        image_at = self.rules.first_frame_at if self.rules is not None else FirstFrameAt.PROMPT
        frames = self.engine_frames(config)
        # dropped only where the request has a frame to spare for it (at the length cap it has not:
        # the repeated frame is then shown, never a frame short of `num_frames`)
        shown = self.max_request_frames if config.num_frames is None else config.num_frames
        drop = self.repeats_last_frame(config) and frames > shown
        return EngineChunkSource(
            self.host,
            config,
            request_id,
            frames,
            self._preset,
            open_encoder,
            image_at,
            self.output_queue_bytes,
            drop_first_frame=drop,
        )

    def repeats_last_frame(self, config: SessionConfig) -> bool:
        """Whether the engine's first frame would repeat the viewer's last one: a continuation
        (a branch or a move: `rebuild`, from the last frame shown) on a model whose first output
        frame is its first frame (`ModelRules.repeats_first_frame`)."""
        return (
            self.rules is not None
            and self.rules.repeats_first_frame
            and config.rebuild is not None
            and config.reference_image is not None
        )

    def engine_frames(self, config: SessionConfig) -> int:
        """Frames the engine is asked for: the session's (`config.num_frames`, which the start's
        resolution already capped at `vllm_omni_max_request_frames` and set to it for a start
        without a length), never more than that cap nor than whole chunks covering the longest
        session. Never open-ended: Helios keeps a request's decoded frames on the GPU until it
        ends (docs/vllm-omni.md, "GPU memory")."""
        longest = math.ceil(self._max_session_seconds * config.fps / config.frames_per_chunk) * config.frames_per_chunk
        wanted = self.max_request_frames if config.num_frames is None else config.num_frames
        wanted += int(self.repeats_last_frame(config))  # the repeated frame is dropped, not shown
        frames = max(1, min(wanted, self.max_request_frames, longest))
        if self.rules is None:
            return frames
        # a count the pipeline runs (LingBot-World: n % 12 == 9), covering the session, within the caps
        cap = self.rules.frame_cap(config.width, config.height, self.max_request_frames)
        return self.rules.request_frames(frames, cap)

    def close(self) -> None:
        self.host.shutdown()
