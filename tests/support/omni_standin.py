"""A STAND-IN for vLLM-Omni's `AsyncOmni`, for tests on machines without a GPU or vLLM.

It implements only what `rtvideo/backend/vllm_omni/` calls (`tests/unit/backend/test_vllm_omni_api.py`
checks that list against the real class). Only the diffusion pipeline itself is imitated;
the interaction path is vLLM-Omni's own code, loaded from the pinned wheel
(`tests/support/vllm_omni_wheel.py`):

- `submit_interaction_async` refuses synchronously exactly what `AsyncOmni.submit_interaction_async`
  does (empty prompt, negative `transition_chunks`, no active request; tests/unit/backend/
  test_vllm_omni_refusals.py runs the wheel's own method beside it on every kind of event and
  compares where and in which words each refuses); everything else is
  queued and handed, as the worker does (`DiffusionModelRunner.submit_interaction`), to the
  wheel's `InteractionCoordinator.enqueue_parts`, built with `InteractionCoordinator.build`
  from the wheel's registry for the configured pipeline class (`model_class_name`, default
  `HeliosPyramidPipeline`); the wheel's `PromptInteractionHandler` validates and blends. A
  refusal there travels the real path: an error raised inside `generate()` (the orchestrator's
  non-fatal `ErrorMessage`), after which the request is aborted;
- interactions are applied where the runner applies them: the initial session before chunk 0,
  then `InteractionMixin.apply_interaction_at_chunk_boundary` (the wheel's mixin) after each
  chunk but the last, its metadata reported on the next chunk's output;
- each output is what the output formatter makes of a Helios chunk: `images=[float32 array
  (1, T, H, W, 3) in [0, 1]]` (T: the `frames_per_chunk` engine argument, else the model's own
  chunks from the rule table, e.g. LingBot-World's 9 then 12) and
  `multimodal_output["metadata"]["stream"]` laid out by the wheel's
  `_stream_metadata_from_diffusion_output`; each chunk's colour is the blended conditioning,
  so a transition is visible in the video;
- the imitated pipeline's `encode_prompt` fails for a prompt containing "stand-in: refuse" (a
  refusal only the engine detects); a prompt containing "stand-in: die" kills the engine:
  outputs stop and `check_health` raises from then on.

The Triton model loads it through the `vllm_omni_engine` parameter
(`tests.support.omni_standin:StandInAsyncOmni`, `paths.STANDIN_ENGINE`; the server's stub imports
it from this checkout: `paths.tests_importable`); its engine arguments configure it:
`record` (a JSON-lines file of every call, for the test to read), `chunk_seconds`,
`first_chunk_seconds`, `frames_per_chunk`, `model_class_name`, `max_num_seqs` (requests run at
once, 1 by default as in the wheel; the others wait inside the engine, as its scheduler keeps them),
`enable_diffusion_pipeline_profiler` (each output's `stage_durations` carries the request's paced
seconds so far under a `.diffuse` key, as the real engine's profiler does). Requests the configured
pipeline would refuse (its size, frame count, steps, pyramid, first frame: the rule table's
`request_problem`) fail inside `generate()`, as the pipeline's `ValueError` does.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from rtvideo.backend.vllm_omni import interaction_rules, model_rules
from tests.support.vllm_omni_wheel import (
    Sampling,
    StepRequestState,
    load_interaction,
    stream_metadata_function,
)


@dataclass
class StandInSamplingParams:
    """The fields of `OmniDiffusionSamplingParams` the adapter sets."""

    width: int | None = None
    height: int | None = None
    num_frames: int = 1
    fps: float | None = None
    frame_rate: float | None = None
    seed: int | None = None
    num_inference_steps: int | None = None
    guidance_scale: float | None = None
    guidance_scale_2: float | None = None
    true_cfg_scale: float | None = None
    boundary_ratio: float | None = None
    extra_args: dict[str, Any] = field(default_factory=dict)
    lora_request: Any = None
    lora_scale: float | None = None
    #: a start's `quality` ("lossless", "high"), as the endpoint sets it when given
    quality: str | None = None
    #: as vLLM-Omni 0.30's: asks for the start notice (an output with no frames) at admission
    emit_request_lifecycle: bool = False


@dataclass
class StandInOutput:
    """The fields of `OmniRequestOutput` the adapter reads."""

    request_id: str
    multimodal_output: dict[str, Any]
    images: list[Any] = field(default_factory=list)
    error: str | None = None
    finished: bool = False
    custom_output: dict[str, Any] = field(default_factory=dict)
    #: the request's stage times so far, as the real engine's with its pipeline profiler on
    stage_durations: dict[str, float] = field(default_factory=dict)
    #: the request's GPU memory peak so far in MiB, as the real engine's runner reports it (its
    #: worker's torch max_memory_reserved); the stand-in's: the decoded history Helios would hold
    #: at its peak, 2 x frames so far x width x height x 12 B
    peak_memory_mb: float = 0.0


def _image_summary(image: Any) -> dict[str, Any]:
    """A first frame passed in `extra_args["image"]`, for the record: its shape, dtype, range and
    mean colour ([1, 3, H, W]: one mean per channel)."""
    array = np.asarray(image)
    mean = array.reshape(array.shape[0] * array.shape[1], -1).mean(axis=1) if array.ndim == 4 else [array.mean()]
    return {
        "shape": list(array.shape),
        "dtype": str(array.dtype),
        "min": float(array.min()),
        "max": float(array.max()),
        "mean": [float(v) for v in mean],
    }


def colour(prompt: str) -> torch.Tensor:
    """A prompt's stand-in conditioning: an RGB colour from its hash."""
    digest = hashlib.sha256(prompt.encode()).digest()
    return torch.tensor([digest[0], digest[1], digest[2]], dtype=torch.float32) / 255.0


def _pipeline_class(mixin: type, types_module: Any, fps: float) -> type:
    """The imitated diffusion pipeline: the wheel's `InteractionMixin` with the hooks a pipeline adds."""

    class StandInPipeline(mixin):
        device = "cpu"
        transformer = SimpleNamespace(dtype=torch.float32)

        def __init__(self, frames_per_chunk: int) -> None:
            self.frames_per_chunk = frames_per_chunk

        def encode_prompt(self, prompt: str, **_: Any) -> tuple[torch.Tensor, None]:
            if "stand-in: refuse" in prompt:
                raise ValueError("stand-in pipeline cannot encode this prompt")
            return colour(prompt), None

        def peek_chunk_media(self, state: Any) -> Any:
            return types_module.ChunkMediaSpec(
                num_media_frames=self.frames_per_chunk, fps=fps, num_latent_frames=self.frames_per_chunk
            )

        def prepare_next_chunk(self, state: Any) -> None:
            pass

    return StandInPipeline


class StandInAsyncOmni:
    """STAND-IN engine (see the module docstring); never used outside tests."""

    def __init__(self, model: str = "", **kwargs: Any) -> None:
        self.model = model
        self.kwargs = kwargs
        self._record = kwargs.get("record")
        self._chunk_seconds = float(kwargs.get("chunk_seconds", 0.05))
        self._first_chunk_seconds = float(kwargs.get("first_chunk_seconds", self._chunk_seconds))
        # the pipeline class as the engine finds it: the argument, else the deploy config's stage
        self._class: str = (
            kwargs.get("model_class_name")
            or interaction_rules.deploy_config_class(kwargs.get("deploy_config"))
            or "HeliosPyramidPipeline"
        )
        self._rules = model_rules.find(model, self._class)
        # the pipeline's own chunks (LingBot-World: 9 frames, then 12), unless a test sets a size
        self._frames_per_chunk = int(
            kwargs.get("frames_per_chunk", self._rules.frames_per_chunk if self._rules else 33)
        )
        self._own_chunks = "frames_per_chunk" not in kwargs and self._rules is not None
        wheel = load_interaction()
        self._stream_metadata = stream_metadata_function()
        self._pipeline = _pipeline_class(wheel["mixin"].InteractionMixin, wheel["types"], 16.0)(self._frames_per_chunk)
        od_config = SimpleNamespace(model_class_name=self._class)
        self._coordinator = wheel["coordinator"].InteractionCoordinator.build(self._pipeline, od_config)
        self._pipeline._interaction_coordinator = self._coordinator
        self._states: dict[str, StepRequestState] = {}
        self._queues: dict[str, asyncio.Queue[Any]] = {}  # request id -> its outputs and errors
        self._produced: set[str] = set()  # requests that have yielded an output
        self._dead = False
        # the scheduler's running requests (`max_num_running_reqs`): a request beyond waits, silently
        self._max_num_seqs = int(kwargs.get("max_num_seqs", 1))
        # `enable_diffusion_pipeline_profiler`: each output carries the request's denoise time so
        # far (the chunks' paced seconds) under a `.diffuse` key, as the real engine's do
        self._profiled = bool(kwargs.get("enable_diffusion_pipeline_profiler", False))
        self._slots: asyncio.Semaphore | None = None  # made on the engine's loop
        self.default_sampling_params_list = [StandInSamplingParams()]
        self._log("init", model=model, kwargs={k: v for k, v in kwargs.items() if k != "record"})

    def _pipeline_refusal(self, image: Any, params: Any) -> str | None:
        """What the configured pipeline refuses of a request, by the rule table that
        tests/unit/backend/test_vllm_omni_model_rules.py checks against the wheel's pipelines:
        its size (Helios: the grid of the pyramid in the request's `extra_args`), frame count,
        step count (None: the pipeline's default), pyramid and first frame; and a first frame in
        `extra_args["image"]` that is not the [1, 3, H, W] tensor in [-1, 1] Helios' VAE takes."""
        rules = self._rules
        if rules is None:
            return None
        extra = dict(params.extra_args or {})
        at_extra_args = rules.first_frame_at is model_rules.FirstFrameAt.EXTRA_ARGS
        given = extra.pop("image", None) if at_extra_args else image
        problem = rules.request_problem(
            params.width, params.height, params.num_frames, params.num_inference_steps, extra, given is not None
        )
        if problem is None and at_extra_args and given is not None:
            array = np.asarray(given)
            if array.shape != (1, 3, params.height, params.width) or array.min() < -1 or array.max() > 1:
                problem = (
                    f"extra_args image must be [1, 3, {params.height}, {params.width}] in [-1, 1], not {array.shape}"
                )
        return problem

    def _log(self, call: str, **fields: Any) -> None:
        if self._record:
            with open(self._record, "a") as f:
                f.write(json.dumps({"call": call, "t": time.monotonic(), **fields}) + "\n")

    async def generate(
        self,
        prompt: Any,
        sampling_params: Any = None,
        request_id: str = "",
        *,
        sampling_params_list: Any = None,
        **_: Any,
    ) -> AsyncIterator[StandInOutput]:
        (params,) = sampling_params_list
        image = (prompt.get("multi_modal_data") or {}).get("image")
        extra_image = (params.extra_args or {}).get("image")
        self._log(
            "generate",
            request_id=request_id,
            prompt={k: v for k, v in prompt.items() if k != "multi_modal_data"},
            image_shape=None if image is None else list(np.asarray(image).shape),
            extra_args_image=None if extra_image is None else _image_summary(extra_image),
            width=params.width,
            height=params.height,
            num_frames=params.num_frames,
            fps=params.fps,
            seed=params.seed,
            num_inference_steps=params.num_inference_steps,
            guidance_scale=params.guidance_scale,
            extra_args={k: v for k, v in (params.extra_args or {}).items() if k != "image"},
            lora_request=params.lora_request,
            quality=getattr(params, "quality", None),
        )
        problem = self._pipeline_refusal(image, params)
        if problem is not None:  # the pipeline raises inside the engine: `generate()` raises it
            self._log("pipeline_refused", request_id=request_id, problem=problem)
            raise ValueError(problem)
        state = StepRequestState(request_id, Sampling())
        self._states[request_id] = state
        messages: asyncio.Queue[Any] = asyncio.Queue()
        self._queues[request_id] = messages
        worker = asyncio.ensure_future(self._run(state, prompt["prompt"], params, messages))
        try:
            while True:
                message = await messages.get()
                if isinstance(message, BaseException):
                    raise message  # as `_process_orchestrator_results` raises an ErrorMessage
                if message.images:  # the start notice carries no frames
                    self._produced.add(request_id)
                yield message
                if message.finished:
                    return
        except (asyncio.CancelledError, GeneratorExit):
            raise
        except Exception:
            self._log("engine_abort", request_id=request_id)  # `generate` aborts its request on an error
            raise
        finally:
            worker.cancel()
            self._states.pop(request_id, None)
            self._queues.pop(request_id, None)
            self._produced.discard(request_id)

    async def _run(self, state: StepRequestState, text: str, params: Any, messages: asyncio.Queue[Any]) -> None:
        """The imitated pipeline, once the scheduler runs the request (at most `max_num_seqs` at
        once, as `diffusion/sched/base_scheduler.py`; the others wait, with no word)."""
        if self._slots is None:
            self._slots = asyncio.Semaphore(self._max_num_seqs)
        async with self._slots:
            self._log("scheduled", request_id=state.request_id)
            await self._steps(state, text, params, messages)

    async def _steps(self, state: StepRequestState, text: str, params: Any, messages: asyncio.Queue[Any]) -> None:
        """The imitated pipeline, stepped as the runner steps it, one chunk per output."""
        try:
            state.prompt_embeds = colour(text)  # prepare_encode
            state.chunk_index = 0
            meta = self._coordinator.maybe_prepare_initial_session(state, self._pipeline)
            if params.emit_request_lifecycle:  # `_emit_request_started_outputs`, once admitted
                notice = {"_diffusion_request_lifecycle": "started"}
                self._log("start_notice", request_id=state.request_id)
                await messages.put(StandInOutput(state.request_id, {}, custom_output=notice))
            sizes = [self._frames_per_chunk] * math.ceil(params.num_frames / self._frames_per_chunk)
            if self._own_chunks and self._rules is not None:
                sizes = self._rules.chunk_frames(params.num_frames)
            chunks = len(sizes)
            computed = 0.0
            for index, size in enumerate(sizes):
                state.interaction_chunk_metadata = meta
                pace = self._first_chunk_seconds if index == 0 else self._chunk_seconds
                await asyncio.sleep(pace)
                computed += pace
                while self._dead:  # a dead engine produces nothing more
                    await asyncio.sleep(3600)
                rgb = state.prompt_embeds.clamp(0, 1).numpy().astype(np.float32)
                video = np.broadcast_to(rgb, (1, size, params.height, params.width, 3)).copy()
                chunk_meta = state.interaction_chunk_metadata  # `_attach_stepwise_metadata`
                state.interaction_chunk_metadata = None
                finished = index == chunks - 1
                diffusion_output = SimpleNamespace(
                    chunk_index=index,
                    total_chunks=chunks,
                    finished=finished,
                    started_event_ids=list(chunk_meta.started_event_ids) if chunk_meta else [],
                    active_event_ids=list(chunk_meta.active_event_ids) if chunk_meta else [],
                    completed_event_ids=list(chunk_meta.completed_event_ids) if chunk_meta else [],
                )
                stream = self._stream_metadata(diffusion_output)
                state.chunk_index = index + 1  # post_decode
                if not finished:  # the runner applies pending interactions for the next chunk
                    self._pipeline.apply_interaction_at_chunk_boundary(state)
                    meta = state.interaction_chunk_metadata
                    self._pipeline.prepare_next_chunk(state)
                await messages.put(
                    StandInOutput(
                        state.request_id,
                        {"metadata": {"stream": stream}} if stream else {},
                        images=[video],
                        finished=finished,
                        stage_durations={"StandInPipeline.diffuse": computed} if self._profiled else {},
                        peak_memory_mb=2 * (index + 1) * len(video) * video[0].size * 4 / 2**20,
                    )
                )
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a request-scoped failure, as the runner reports it
            await messages.put(RuntimeError(f"stand-in pipeline failed: {exc}"))

    async def submit_interaction_async(self, request_id: str, *, interaction: dict[str, Any]) -> None:
        event = interaction.get("event")
        prompt = event.get("prompt") if isinstance(event, dict) else None
        early = request_id not in self._produced
        self._log(
            "submit",
            request_id=request_id,
            event_id=interaction.get("event_id"),
            prompt=prompt,
            multi_modal_data=event.get("multi_modal_data") if isinstance(event, dict) else None,
            transition_chunks=interaction.get("transition_chunks"),
            before_first_output=early,
        )
        # `AsyncOmni.submit_interaction_async`'s own checks (this stand-in is one diffusion stage)
        if isinstance(event, dict) and "prompt" in event and (not isinstance(prompt, str) or not prompt):
            raise ValueError("prompt must be non-empty")
        transition_chunks = interaction.get("transition_chunks")
        if transition_chunks is not None and transition_chunks < 0:
            raise ValueError("transition_chunks must be >= 0")
        if request_id not in self._states:
            raise ValueError(f"No active request for interaction: {request_id!r}")
        if isinstance(prompt, str) and "stand-in: die" in prompt:
            self._dead = True
            return
        # queued: the orchestrator hands it to the worker, whose refusal comes back through `generate()`
        asyncio.get_running_loop().call_soon(self._worker_interaction, request_id, interaction)

    def _worker_interaction(self, request_id: str, interaction: dict[str, Any]) -> None:
        """`Orchestrator._handle_interaction` → `DiffusionModelRunner.submit_interaction`."""
        state, messages = self._states.get(request_id), self._queues.get(request_id)
        if state is None or messages is None:
            return  # the real orchestrator sends an error to a request that is gone: nobody reads it
        try:
            event = interaction["event"]
            parts: list[tuple[str, Any]] = []
            if event.get("prompt") is not None:
                parts.append(("prompt", {"prompt": event["prompt"]}))
            parts.extend((str(m), payload) for m, payload in (event.get("multi_modal_data") or {}).items())
            self._coordinator.enqueue_parts(
                state,
                parts=parts,
                event_id=interaction["event_id"],
                received_at=time.monotonic(),
                transition_chunks=interaction.get("transition_chunks"),
            )
        except Exception as exc:  # noqa: BLE001 - the orchestrator's non-fatal ErrorMessage
            self._log("refused", request_id=request_id, event_id=interaction.get("event_id"), error=str(exc))
            messages.put_nowait(RuntimeError(f"Failed interaction for request {request_id}: {exc}"))

    async def abort(self, request_id: str, *, timeout: float | None = None) -> None:
        self._log("abort", request_id=request_id)

    def get_diffusion_od_config(self) -> Any:
        """The inline diffusion worker's config: `max_num_seqs` as built (`OmniDiffusionConfig`'s
        default 1, as in the wheel)."""
        return SimpleNamespace(
            max_num_seqs=int(self.kwargs.get("max_num_seqs", 1)),
            model_class_name=self._class,
        )

    async def check_health(self) -> None:
        if self._dead:
            raise RuntimeError("stand-in engine died")

    def shutdown(self, timeout: float | None = None) -> None:
        self._log("shutdown")
