"""The `vllm_omni` generator: one vLLM-Omni `AsyncOmni` engine hosted in the Triton model.

Hosted the way Triton's `vllm_backend` hosts vLLM:

- one thread runs one asyncio loop that owns the engine (`EngineHost`); requests and
  interactions reach it with `asyncio.run_coroutine_threadsafe`;
- the loop never calls Triton: each session's outputs go into that session's queue, and
  the session's own worker thread translates, encodes and sends them (`EngineChunkSource`);
- a stop, a cancelled stream or a disconnect ends the session, whose source then aborts
  the engine request (`abort`);
- a periodic `check_health()`; a failure calls the `when_dead` callback (on a thread of its
  own), which ends live sessions with `generation_failed` and makes the model refuse the
  health probe;
- `shutdown()` (the model's `finalize`) aborts what runs, shuts the engine down, stops the
  loop and frees the GPU.

Transitions belong to the engine in this mode: each acked interaction is forwarded with
`submit_interaction_async` as soon as the engine can take it (`_Request`), and its per-chunk
stream metadata is translated into our chunk metadata by
`rtvideo.core.stream_translation.EngineStreamTranslator`.

The engine class is a parameter (`vllm_omni_engine`, `module:callable` of an importable
module): the real `vllm_omni:AsyncOmni`, or any factory with its interface (a stand-in engine
on a machine without a GPU). Only the `AsyncOmni` methods and keywords used here may be called
on it; `tests/unit/backend/test_vllm_omni_api.py` checks each against the real class's source.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import copy
import gc
import importlib
import logging
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from rtvideo.backend.runtime.capacity import RUNNING, RUNNING_WALL_CLOCK
from rtvideo.backend.vllm_omni.engine_limits import engine_max_num_seqs
from rtvideo.backend.vllm_omni.engine_timing import ChunkTimer
from rtvideo.backend.vllm_omni.model_rules import STEP_MODE_DEFAULT_STEPS, FirstFrameAt
from rtvideo.backend.vllm_omni.output_queue import OutputQueue, output_bytes, output_frames
from rtvideo.core.session_config import SessionConfig
from rtvideo.core.streaming_pacing import StreamingPacing
from rtvideo.process import interpreter

log = logging.getLogger(__name__)

#: the vllm-omni release this adapter is written and tested against (its major.minor must equal
#: vLLM's); scripts/setup.sh and the Dockerfile pin the same one
PINNED_VLLM_OMNI = "0.30.0"

_HEALTH_TIMEOUT = 30.0  # a health check that takes longer counts as failed
_ABORT_TIMEOUT = 10.0


class EngineError(RuntimeError):
    """The engine failed one session's generation (the session ends with `generation_failed`)."""


def load_factory(spec: str) -> Callable[..., Any]:
    """`module:callable` → the callable (the engine class), imported as any module is.

    Imports the engine's module in UTF-8 text mode (`interpreter.utf8_text`): inside Triton's
    stub vLLM's import fails otherwise."""
    interpreter.utf8_text()
    module_name, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def engine_prompt(
    prompt: Mapping[str, Any], config: SessionConfig, image_at: FirstFrameAt = FirstFrameAt.PROMPT
) -> dict[str, Any]:
    """The request's `OmniTextPrompt`: a start's `negative_prompt` belongs to the prompt, not the
    sampling params (as in vLLM-Omni's streaming endpoint)."""
    out = dict(prompt)
    negative = config.sampling.get("negative_prompt")
    if negative is not None:
        out["negative_prompt"] = negative
    if config.reference_image is not None and image_at is FirstFrameAt.PROMPT:
        out["multi_modal_data"] = {"image": reference_image(config.reference_image)}  # as the endpoint does
    return out


def extra_args_image(rgb: Any) -> Any:
    """A decoded `image_reference` (uint8 RGB [H, W, 3]) as Helios' step mode reads
    `extra_args["image"]`: straight into its VAE (`prepare_image_latents`, no preprocessing), so a
    float tensor [1, 3, H, W] in [-1, 1]; a float32 array of that shape where torch is absent."""
    import numpy as np

    array = (np.asarray(rgb, dtype=np.float32) / 127.5 - 1.0).transpose(2, 0, 1)[None]
    try:
        import torch
    except ImportError:
        return array
    return torch.from_numpy(np.ascontiguousarray(array))


def reference_image(rgb: Any) -> Any:
    """A decoded `image_reference` (uint8 RGB [H, W, 3]) as vLLM-Omni's endpoint hands it to the
    engine: a PIL image (`_decode_image_reference`); the array itself where PIL is absent (a
    stand-in engine on a machine without vLLM)."""
    try:
        from PIL import Image
    except ImportError:
        return rgb
    return Image.fromarray(rgb, "RGB")


def apply_lora(params: Any, lora: Mapping[str, Any]) -> None:
    """A start's `lora` on the request, as vLLM-Omni's streaming endpoint applies it
    (`_apply_lora`: `parse_lora_request` → `lora_request`, `lora_scale`). Without vllm-omni
    importable (a stand-in engine) the object is set as sent. A malformed one fails the start."""
    try:
        from vllm_omni.entrypoints.openai.utils import parse_lora_request
    except ImportError:
        params.lora_request = copy.deepcopy(dict(lora))
        return
    try:
        request, scale = parse_lora_request(dict(lora))
    except ValueError as exc:
        raise EngineError(f"lora: {exc}") from exc
    if request is None:
        return
    params.lora_request = request
    if scale is not None:
        params.lora_scale = scale


#: `vllm_omni.diffusion.data`: the key and value of the `custom_output` of the output a request
#: with `emit_request_lifecycle` yields when the scheduler admits it (no frames)
LIFECYCLE_KEY = "_diffusion_request_lifecycle"
LIFECYCLE_STARTED = "started"


def is_start_notice(output: Any) -> bool:
    """The engine's notice that it admitted the request (`is_diffusion_request_started_output`)."""
    custom = getattr(output, "custom_output", None)
    return isinstance(custom, dict) and custom.get(LIFECYCLE_KEY) == LIFECYCLE_STARTED


def ask_for_start_notice(engine_params: Any) -> bool:
    """Ask the engine to say when it admits the request (`emit_request_lifecycle`, as vLLM-Omni's
    own video endpoint does); False for params without that field (then the first output is the
    first sign)."""
    if not hasattr(engine_params, "emit_request_lifecycle"):
        return False
    engine_params.emit_request_lifecycle = True
    return True


@dataclass(frozen=True)
class EngineRequest:
    """What one session asks the engine for (`EngineHost.start_request`); its outputs go to `sink`."""

    request_id: str
    #: `{"prompt": ...}`; a start's negative prompt and image join it (`engine_prompt`)
    prompt: Mapping[str, Any]
    config: SessionConfig
    num_frames: int
    preset: Mapping[str, Any]
    sink: OutputQueue
    #: where the model's pipeline reads a start's `image_reference`
    image_at: FirstFrameAt = FirstFrameAt.PROMPT
    #: the start's `streaming_pacing` for an engine that pauses paced requests (`EngineHost.paces`)
    pacing: StreamingPacing | None = None


class _Request:
    """One live engine request on the loop.

    vLLM-Omni refuses an interaction the worker cannot apply yet, and a refusal aborts the request
    (`generate()` raises it): the runner has no state for a request the scheduler has not admitted
    ("No active request state"), and a prompt update needs the prompt encoded by the request's
    first step (`prepare_encode`). The engine's busy loop runs an interaction between scheduler
    steps, after the step that admitted the request and ran `prepare_encode`; the start notice is
    put out just before that step, so whatever is submitted once it has arrived is taken. Without
    a notice the first output is the sign.

    Invariants: `order` is held by at most one interaction at a time, in the order they were
    submitted (asyncio locks are FIFO), and by it across `ready.wait()` and the engine call, so
    interactions reach the engine in submission order; `ready` is set once the engine can take
    interactions or the request is over (`over`), so no waiter sleeps past either; nothing is
    submitted once `over` is set.
    """

    def __init__(self) -> None:
        self.order = asyncio.Lock()
        self.ready = asyncio.Event()
        self.over = False  # ended by us, or its stream finished or failed
        self.task: asyncio.Task | None = None

    def finish(self) -> None:
        self.over = True
        self.ready.set()


def engine_paces(engine: Any, max_num_seqs: int) -> bool:
    """Whether the engine pauses a paced request itself (vLLM-Omni 0.32): read from its public API,
    not its version: `update_streaming_playback` and a diffusion params field
    `streaming_buffer_seconds`. 0.32 refuses a paced request unless `max_num_seqs == 1`
    (`diffusion_engine.py`, `add_request`), so a deployment running more at once does not pace."""
    if max_num_seqs != 1 or not callable(getattr(engine, "update_streaming_playback", None)):
        return False
    defaults = [p for p in engine.default_sampling_params_list if hasattr(p, "num_frames")]
    return bool(defaults) and hasattr(defaults[0], "streaming_buffer_seconds")


#: (frames, seconds, width, height, requests running at once, where the seconds came from): one
#: chunk's generation, for the running real-time capacity (`RealtimeCapacity.observe`)
RateObserver = Callable[[int, float, int, int, int, str], None]


def _report_dead(callback: Callable[[str], None], reason: str) -> None:
    """The callback ends sessions (Triton sends): on a thread of its own, never on the loop."""
    threading.Thread(target=callback, args=(reason,), name="engine-dead", daemon=True).start()


class EngineHost:
    """One asyncio loop thread that owns one engine; every engine call happens on that loop."""

    def __init__(
        self,
        factory: Callable[..., Any],
        *,
        model: str,
        engine_args: Mapping[str, Any],
        health_seconds: float,
        start_timeout: float = 3600.0,
    ) -> None:
        # the engine's worker processes must start as this environment's Python even inside
        # Triton's stub (sys.executable the stub, sys.argv [""]): set before the engine exists
        self.worker_python = interpreter.prepare_spawn()
        self._factory = factory
        self._model = model
        self._engine_args = dict(engine_args)
        self._health_seconds = health_seconds
        self._dead_lock = threading.Lock()  # `dead` and `_on_dead` (the loop vs `when_dead`)
        self._on_dead: Callable[[str], None] | None = None
        self._engine: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        # request id -> its state; made by `_start`, removed by `_end`, so a live request has
        # exactly one and an ended one none (an interaction then fails)
        self._requests: dict[str, _Request] = {}
        self._ready = threading.Event()
        self._startup_error: BaseException | None = None
        self.dead: str | None = None
        #: the engine's effective `max_num_seqs` and where it was read (`engine_limits`), once started
        self.max_num_seqs = 0
        self.max_num_seqs_from = ""
        #: whether the engine pauses paced requests itself (`engine_paces`), once started
        self.paces = False
        #: told each chunk's generation time after a request's first (set by the composition root)
        self.observe_rate: RateObserver | None = None
        self._thread = threading.Thread(target=asyncio.run, args=(self._main(),), name="vllm-omni-loop", daemon=True)
        self._thread.start()
        if not self._ready.wait(start_timeout):
            raise TimeoutError(f"the engine did not start within {start_timeout:g} s")
        if self._startup_error is not None:
            self._thread.join()
            raise RuntimeError(f"the engine failed to start: {self._startup_error}") from self._startup_error

    # --- the loop thread ----------------------------------------------------------------
    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        try:
            self._engine = self._factory(model=self._model, **self._engine_args)
            self.max_num_seqs, self.max_num_seqs_from = engine_max_num_seqs(self._diffusion_config(), self._engine_args)
            self.paces = engine_paces(self._engine, self.max_num_seqs)
        except BaseException as exc:  # noqa: BLE001 - reported to the constructor
            self._startup_error = exc
            self._ready.set()
            return
        self._ready.set()
        log.info("engine %s ready (model %s)", type(self._engine).__name__, self._model)
        health = asyncio.create_task(self._watch_health())
        await self._stopping.wait()
        health.cancel()
        for request_id in list(self._requests):
            await self._end(request_id)
        try:
            self._engine.shutdown()
        except Exception:
            log.exception("engine shutdown failed")
        self._engine = None

    def _diffusion_config(self) -> Any:
        """The engine's diffusion config as it runs (its `max_num_seqs`), None where it gives none."""
        try:
            return self._engine.get_diffusion_od_config()
        except Exception as exc:  # noqa: BLE001 - an engine without one: what it was built with counts
            log.info("the engine's diffusion config is not readable (%s); its arguments count", exc)
            return None

    async def _watch_health(self) -> None:
        while True:
            await asyncio.sleep(self._health_seconds)
            try:
                await asyncio.wait_for(self._engine.check_health(), _HEALTH_TIMEOUT)
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # noqa: BLE001 - any failure means the engine is gone
                reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                log.error("engine health check failed: %s", reason)
                with self._dead_lock:
                    self.dead, callback = reason, self._on_dead
                if callback is not None:
                    _report_dead(callback, reason)
                return

    async def _stream(self, wanted: EngineRequest, request: _Request) -> None:
        config, sink, request_id = wanted.config, wanted.sink, wanted.request_id
        try:
            params = self._sampling_params(config, wanted.num_frames, wanted.preset)
            if wanted.pacing is not None:  # the engine pauses the request itself (0.32's `inputs/data.py`)
                params.streaming_buffer_seconds = wanted.pacing.max_lead_seconds
                params.streaming_max_output_bytes = wanted.pacing.max_output_bytes
                params.streaming_idle_timeout_s = wanted.pacing.idle_timeout_s
            if config.reference_image is not None and wanted.image_at is FirstFrameAt.EXTRA_ARGS:
                params.extra_args = {**params.extra_args, "image": extra_args_image(config.reference_image)}
            ask_for_start_notice(params)
            prompt = engine_prompt(wanted.prompt, config, wanted.image_at)
            outputs = self._engine.generate(prompt=prompt, request_id=request_id, sampling_params_list=[params])
            # the engine's rate: each chunk's own compute time as the engine reports it
            # (`engine_timing`: denoise + decode, no queue wait), else the wall-clock time from the
            # previous output (every output is read as soon as the engine yields it); the first
            # chunk of a request is left out (a compile, the prompt's encoding)
            asked, timed, timer = time.monotonic(), False, ChunkTimer()
            async for output in outputs:
                now = time.monotonic()
                request.ready.set()  # admitted (the notice) or past its first step (an output)
                if is_start_notice(output):
                    asked = now  # queued until here: its generation starts now
                    continue  # carries no frames
                computed = timer.chunk_seconds(output)
                if timed:
                    if computed is not None:
                        self._observe(output_frames(output), computed, config, RUNNING)
                    else:
                        self._observe(output_frames(output), now - asked, config, RUNNING_WALL_CLOCK)
                # never held back: upstream's own per-request queue is unbounded, so a reader that
                # waits only moves the frames there; the bound is enforced here (`OutputQueue`)
                if not sink.offer(output, now, output_bytes(output)):
                    await self._abort_over_bound(request_id, outputs)
                    return  # the queue told the session (its `overflow` item)
                asked, timed = now, True
            sink.put("end", None, time.monotonic())
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - the session reports it
            sink.put("error", exc, time.monotonic())
        finally:
            request.finish()  # the engine has no such request any more: waiting interactions fail

    async def _abort_over_bound(self, request_id: str, outputs: Any) -> None:
        """A session over its output bound: the engine stops making frames for it (abort), and
        our reading of the stream ends (its generator closed, so nothing more is queued)."""
        log.warning("request_id=%s over its output bound: aborting the engine request", request_id)
        try:
            await asyncio.wait_for(self._engine.abort(request_id), _ABORT_TIMEOUT)
        except Exception:
            log.warning("request_id=%s engine abort failed", request_id, exc_info=True)
        close = getattr(outputs, "aclose", None)
        if close is not None:
            with contextlib.suppress(Exception):
                await close()

    def _observe(self, frames: int, seconds: float, config: SessionConfig, how: str) -> None:
        """Report one chunk's time with the requests that really run at once: those the engine has
        admitted (its start notice, or an output). The scheduler admits a request beside a running
        one only when their batching keys match, up to `max_num_seqs`
        (`diffusion/sched/base_scheduler.py`), so one waiting inside the engine is not counted."""
        observe = self.observe_rate
        if observe is not None:
            running = sum(1 for r in self._requests.values() if r.ready.is_set() and not r.over)
            observe(frames, seconds, config.width, config.height, running, how)

    def _sampling_params(self, config: SessionConfig, num_frames: int, preset: Mapping[str, Any]) -> Any:
        """The engine's own default diffusion params, with this session's values set as vLLM-Omni's
        streaming endpoint sets a request's (`serving_video_output_stream.py`,
        `_build_prompt_and_sampling_params`): `config.sampling` is the model's preset with the
        start's sampling fields and `extra_params` merged over it."""
        defaults = [p for p in self._engine.default_sampling_params_list if hasattr(p, "num_frames")]
        if not defaults:
            raise EngineError("the engine has no diffusion stage (no default params with num_frames)")
        params = copy.deepcopy(defaults[0])
        params.width, params.height = config.width, config.height
        params.fps, params.frame_rate = config.fps, float(config.fps)
        params.num_frames = num_frames
        params.seed = config.seed
        sampling = config.sampling
        if sampling.get("num_inference_steps") is not None:
            params.num_inference_steps = sampling["num_inference_steps"]
        if params.num_inference_steps is None:  # the step scheduler refuses a request without a count
            params.num_inference_steps = STEP_MODE_DEFAULT_STEPS
        if sampling.get("guidance_scale") is not None:  # the engine marks it provided (request.py)
            params.guidance_scale = sampling["guidance_scale"]
        if sampling.get("guidance_scale_2") is not None:
            params.guidance_scale_2 = sampling["guidance_scale_2"]
        if sampling.get("true_cfg_scale") is not None:
            params.true_cfg_scale = sampling["true_cfg_scale"]
        if sampling.get("boundary_ratio") is not None:
            params.boundary_ratio = sampling["boundary_ratio"]
        extra = {**(getattr(params, "extra_args", None) or {}), **preset}
        if sampling.get("flow_shift") is not None:  # vLLM-Omni passes it in extra_args
            extra["flow_shift"] = sampling["flow_shift"]
        extra.update(copy.deepcopy(dict(sampling.get("extra_params") or {})))
        params.extra_args = extra
        if sampling.get("quality") is not None:  # as the endpoint: set only when the start gives it
            params.quality = sampling["quality"]
        if sampling.get("lora") is not None:
            apply_lora(params, sampling["lora"])
        return params

    async def _interact(self, request_id: str, interaction: Mapping[str, Any]) -> None:
        request = self._requests.get(request_id)
        if request is None or request.over:  # ended (or never started): nothing to order it after
            raise EngineError(f"request {request_id} is not running")
        async with request.order:
            await request.ready.wait()
            # checked after every wait: the request may have ended while this one queued behind
            # another interaction or waited for the engine to take interactions
            if request.over:
                raise EngineError(f"request {request_id} ended before the interaction reached the engine")
            await self._engine.submit_interaction_async(request_id, interaction=dict(interaction))

    async def _end(self, request_id: str) -> None:
        """Stop consuming a request's outputs and abort it in the engine unless it finished."""
        request = self._requests.pop(request_id, None)
        if request is None:
            return
        request.finish()
        task = request.task
        if task is not None and not task.done():
            task.cancel()
            try:
                await asyncio.wait_for(self._engine.abort(request_id), _ABORT_TIMEOUT)
            except Exception:
                log.warning("request_id=%s engine abort failed", request_id, exc_info=True)

    # --- any thread ---------------------------------------------------------------------
    def when_dead(self, callback: Callable[[str], None]) -> None:
        """Call `callback(reason)` once when the engine fails its health check (at once if it
        has already). Set after construction: its owner, the session manager, is built from
        this host's sources."""
        with self._dead_lock:
            self._on_dead, dead = callback, self.dead
        if dead is not None:
            _report_dead(callback, dead)

    def _submit(self, coro: Any) -> concurrent.futures.Future[Any]:
        if self._loop is None or self._engine is None:
            coro.close()
            raise EngineError("the engine is not running")
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def start_request(self, wanted: EngineRequest) -> None:
        """Start streaming the request's outputs into its sink (waits only for the task to be created)."""

        async def start() -> None:  # on the loop
            request = _Request()
            self._requests[wanted.request_id] = request
            request.task = asyncio.get_running_loop().create_task(self._stream(wanted, request))

        self._submit(start()).result(_ABORT_TIMEOUT)

    def interact(self, request_id: str, interaction: Mapping[str, Any]) -> concurrent.futures.Future[Any]:
        """Forward one interaction, after those forwarded before it, as soon as the engine can
        take it; the future fails when the engine refuses it or the request ends first."""
        return self._submit(self._interact(request_id, interaction))

    def playback(self, request_id: str, position_seconds: float) -> None:
        """Forward a player's position to a paced request (the engine clamps it); does not wait.
        A report the engine refuses (the request over) changes nothing: it is logged only."""

        async def forward() -> None:
            if request_id not in self._requests:
                return
            try:
                await self._engine.update_streaming_playback(request_id, position_seconds)
            except Exception as exc:  # noqa: BLE001 - a report is never an error (0.32's clamp)
                log.debug("request_id=%s playback report not taken: %s", request_id, exc)

        with contextlib.suppress(EngineError, RuntimeError):
            self._submit(forward())

    def end_request(self, request_id: str) -> None:
        """Abort the request unless it has finished (does not wait)."""
        with contextlib.suppress(EngineError, RuntimeError):  # the loop is gone: nothing left to abort
            self._submit(self._end(request_id))

    def shutdown(self, timeout: float = 60.0) -> None:
        """Abort every request, shut the engine down, stop the loop and free the GPU."""
        if self._loop is not None and self._stopping is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join(timeout)
        gc.collect()
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            torch.cuda.empty_cache()
