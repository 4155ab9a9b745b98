"""The `vllm_omni` generator: one vLLM-Omni `AsyncOmni` engine hosted in the Triton model.

Hosted the way Triton's `vllm_backend` hosts vLLM:

- one thread runs one asyncio loop that owns the engine (`EngineHost`); requests and
  interactions reach it with `asyncio.run_coroutine_threadsafe`;
- the loop never calls Triton: each session's outputs go into that session's queue, and
  the session's own worker thread translates, encodes and sends them (`EngineChunkSource`);
- a stop, a cancelled stream or a disconnect ends the session, whose source then aborts
  the engine request (`abort`);
- a periodic `check_health()`; a failure calls `on_dead` (on a thread of its own), which
  ends live sessions with `generation_failed` and makes the model refuse the health probe;
- `shutdown()` (the model's `finalize`) aborts what runs, shuts the engine down, stops the
  loop and frees the GPU.

Transitions belong to the engine in this mode: each acked interaction is forwarded with
`submit_interaction_async`, held until the engine produced its first output (it refuses
them before), and its per-chunk stream metadata is translated into our chunk metadata by
`rtvideo.core.stream_translation.EngineStreamTranslator`.

The engine class is a parameter (`vllm_omni_engine`, `module:callable`): the real
`vllm_omni:AsyncOmni`, or a stand-in in tests (`tests/omni_standin.py`). Only the
`AsyncOmni` methods and keywords used here may be called on it;
`tests/test_vllm_omni_api.py` checks each against the real class's source.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import gc
import importlib
import importlib.util
import logging
import math
import queue
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from rtvideo.backend.sources import EventFailed, SourceChunk
from rtvideo.core.session_config import SessionConfig
from rtvideo.core.stream_translation import EngineStreamTranslator
from rtvideo.core.transitions import Outcome

log = logging.getLogger(__name__)

#: the vllm-omni release this adapter is written and tested against (its major.minor must equal
#: vLLM's); scripts/setup.sh and the Dockerfile pin the same one
PINNED_VLLM_OMNI = "0.30.0"

_POLL_SECONDS = 0.25  # how often a session waiting for the engine checks for cancellation
_HEALTH_TIMEOUT = 30.0  # a health check that takes longer counts as failed
_ABORT_TIMEOUT = 10.0


class EngineError(RuntimeError):
    """The engine failed one session's generation (the session ends with `generation_failed`)."""


def load_factory(spec: str) -> Callable[..., Any]:
    """`module:callable` or `path/to/file.py:callable` → the callable (the engine class)."""
    module_name, _, attr = spec.rpartition(":")
    if not module_name or not attr:
        raise ValueError(f"engine factory {spec!r}: use module:callable")
    if module_name.endswith(".py"):
        path = Path(module_name)
        name = f"rtvideo_engine_{path.stem}"
        module_spec = importlib.util.spec_from_file_location(name, path)
        if module_spec is None or module_spec.loader is None:
            raise ImportError(f"cannot load {path}")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        module_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(module_name)
    return getattr(module, attr)


class EngineHost:
    """One asyncio loop thread that owns one engine; every engine call happens on that loop."""

    def __init__(
        self,
        factory: Callable[..., Any],
        *,
        model: str,
        engine_args: Mapping[str, Any],
        health_seconds: float,
        on_dead: Callable[[str], None],
        start_timeout: float = 3600.0,
    ) -> None:
        self._factory = factory
        self._model = model
        self._engine_args = dict(engine_args)
        self._health_seconds = health_seconds
        self._on_dead = on_dead
        self._engine: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._tasks: dict[str, asyncio.Task] = {}  # request id -> its streaming task
        self._order: dict[str, asyncio.Lock] = {}  # request id -> keeps its interactions in order
        self._ready = threading.Event()
        self._startup_error: BaseException | None = None
        self.dead: str | None = None
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
        except BaseException as exc:  # noqa: BLE001 - reported to the constructor
            self._startup_error = exc
            self._ready.set()
            return
        self._ready.set()
        log.info("engine %s ready (model %s)", type(self._engine).__name__, self._model)
        health = asyncio.create_task(self._watch_health())
        await self._stopping.wait()
        health.cancel()
        for request_id in list(self._tasks):
            await self._end(request_id)
        try:
            self._engine.shutdown()
        except Exception:  # noqa: BLE001 - shutting down anyway
            log.exception("engine shutdown failed")
        self._engine = None

    async def _watch_health(self) -> None:
        while True:
            await asyncio.sleep(self._health_seconds)
            try:
                await asyncio.wait_for(self._engine.check_health(), _HEALTH_TIMEOUT)
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # noqa: BLE001 - any failure means the engine is gone
                self.dead = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                log.error("engine health check failed: %s", self.dead)
                # The callback ends sessions (Triton sends): never on this loop.
                threading.Thread(target=self._on_dead, args=(self.dead,), name="engine-dead", daemon=True).start()
                return

    async def _stream(self, request_id: str, prompt: Mapping[str, Any], config: SessionConfig, num_frames: int,
                      preset: Mapping[str, Any], sink: "queue.Queue[tuple]") -> None:
        try:
            params = self._sampling_params(config, num_frames, preset)
            outputs = self._engine.generate(prompt=dict(prompt), request_id=request_id, sampling_params_list=[params])
            async for output in outputs:
                sink.put(("output", output, time.monotonic()))  # unbounded: never blocks the loop
            sink.put(("end", None, time.monotonic()))
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - the session reports it
            sink.put(("error", exc, time.monotonic()))

    def _sampling_params(self, config: SessionConfig, num_frames: int, preset: Mapping[str, Any]) -> Any:
        """The engine's own default diffusion params, with this session's values set (as vLLM-Omni's
        streaming endpoint builds them)."""
        defaults = [p for p in self._engine.default_sampling_params_list if hasattr(p, "num_frames")]
        if not defaults:
            raise EngineError("the engine has no diffusion stage (no default params with num_frames)")
        params = copy.deepcopy(defaults[0])
        params.width, params.height = config.width, config.height
        params.fps, params.frame_rate = config.fps, float(config.fps)
        params.num_frames = num_frames
        params.seed = config.seed
        params.extra_args = {**(getattr(params, "extra_args", None) or {}), **preset}
        return params

    async def _interact(self, request_id: str, interaction: Mapping[str, Any]) -> None:
        async with self._order.setdefault(request_id, asyncio.Lock()):
            await self._engine.submit_interaction_async(request_id, interaction=dict(interaction))

    async def _end(self, request_id: str) -> None:
        """Stop consuming a request's outputs and abort it in the engine unless it finished."""
        self._order.pop(request_id, None)
        task = self._tasks.pop(request_id, None)
        if task is None:
            return
        if not task.done():
            task.cancel()
            try:
                await asyncio.wait_for(self._engine.abort(request_id), _ABORT_TIMEOUT)
            except Exception:  # noqa: BLE001 - the engine may be gone
                log.warning("request_id=%s engine abort failed", request_id, exc_info=True)

    def _start(self, request_id: str, prompt: Mapping[str, Any], config: SessionConfig, num_frames: int,
               preset: Mapping[str, Any], sink: "queue.Queue[tuple]") -> None:
        self._tasks[request_id] = asyncio.get_running_loop().create_task(
            self._stream(request_id, prompt, config, num_frames, preset, sink))

    # --- any thread ---------------------------------------------------------------------
    def _submit(self, coro: Any) -> "concurrent.futures.Future[Any]":
        if self._loop is None or self._engine is None:
            coro.close()
            raise EngineError("the engine is not running")
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def start_request(self, request_id: str, prompt: Mapping[str, Any], config: SessionConfig, num_frames: int,
                      preset: Mapping[str, Any], sink: "queue.Queue[tuple]") -> None:
        """Start streaming a request's outputs into `sink` (waits only for the task to be created)."""

        async def start() -> None:
            self._start(request_id, prompt, config, num_frames, preset, sink)

        self._submit(start()).result(_ABORT_TIMEOUT)

    def interact(self, request_id: str, interaction: Mapping[str, Any]) -> "concurrent.futures.Future[Any]":
        """Forward one interaction; the future fails when the engine refuses it."""
        return self._submit(self._interact(request_id, interaction))

    def end_request(self, request_id: str) -> None:
        """Abort the request unless it has finished (does not wait)."""
        try:
            self._submit(self._end(request_id))
        except (EngineError, RuntimeError):  # the loop is gone: nothing left to abort
            pass

    def shutdown(self, timeout: float = 60.0) -> None:
        """Abort every request, shut the engine down, stop the loop and free the GPU."""
        if self._loop is not None and self._stopping is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join(timeout)
        gc.collect()
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            torch.cuda.empty_cache()


class EngineChunkSource:
    """A session's chunks from the engine: its outputs, with its stream metadata translated."""

    #: waiting before `next_chunk` does not slow the engine down, so the session does not pace
    pacing = False

    def __init__(self, host: EngineHost, config: SessionConfig, request_id: str, num_frames: int,
                 preset: Mapping[str, Any], on_event_failed: EventFailed) -> None:
        self._host = host
        self._config = config
        self._request_id = request_id
        self._on_event_failed = on_event_failed
        self._translator = EngineStreamTranslator()
        self._waiting: dict[str, tuple[str, int]] = {}  # held event -> (prompt, N)
        self._first_output = False
        self._closed = False
        self._lock = threading.Lock()  # translator + forwarding (request path vs worker)
        self._queue: "queue.Queue[tuple]" = queue.Queue()
        self._last = time.monotonic()
        host.start_request(request_id, {"prompt": config.prompt}, config, num_frames, preset, self._queue)

    def admit(self, event_id: str, prompt: str, transition_chunks: int | None) -> None:
        n = self._config.default_transition_chunks if transition_chunks is None else transition_chunks
        with self._lock:
            self._translator.admit(event_id, n)
            self._waiting[event_id] = (prompt, n)
            if self._first_output:  # before it, the engine refuses interactions: hold them
                self._forward(event_id)

    def _forward(self, event_id: str) -> None:
        """Hand one held event to the engine (under the lock, so forwards keep admission order)."""
        prompt, n = self._waiting.pop(event_id)
        self._translator.forwarded(event_id)
        interaction = {"event_id": event_id, "event": {"prompt": prompt}, "transition_chunks": n}
        try:
            future = self._host.interact(self._request_id, interaction)
        except Exception as exc:  # noqa: BLE001 - reported like a refusal
            self._queue.put(("event_failed", (event_id, exc), time.monotonic()))
            return

        def done(f: "concurrent.futures.Future[Any]") -> None:
            exc = None if f.cancelled() else f.exception()
            if exc is not None or f.cancelled():
                self._queue.put(("event_failed", (event_id, exc), time.monotonic()))

        future.add_done_callback(done)

    def next_chunk(self, max_frames: int, interrupted: Callable[[], bool]) -> SourceChunk | None:
        while True:
            try:
                kind, value, at = self._queue.get(timeout=_POLL_SECONDS)
            except queue.Empty:
                if interrupted():
                    return None
                continue
            if kind == "event_failed":
                event_id, exc = value
                self._on_event_failed(event_id, f"the engine refused the interaction: {exc}",
                                      lambda e=event_id: self._forget(e))
            elif kind == "error":
                raise EngineError(f"the engine failed: {type(value).__name__}: {value}") from value
            elif kind == "end":
                raise EngineError("the engine ended the stream before the session's last frame")
            else:
                return self._chunk(value, at)

    def _chunk(self, output: Any, at: float) -> SourceChunk:
        error = getattr(output, "error", None)
        if error:
            raise EngineError(f"the engine reported: {error}")
        frames = rgb_frames(output_video(output))
        if frames.shape[1:3] != (self._config.height, self._config.width):
            raise EngineError(f"the engine produced {frames.shape[2]}x{frames.shape[1]} frames, "
                              f"the session is {self._config.width}x{self._config.height}")
        with self._lock:
            plan = self._translator.chunk(stream_metadata(output))
            if not self._first_output:
                self._first_output = True
                for event_id in self._translator.held:
                    self._forward(event_id)
        seconds, self._last = at - self._last, at
        return SourceChunk(plan, frames, seconds)

    def _forget(self, event_id: str) -> None:
        with self._lock:
            self._translator.failed(event_id)

    def finish(self) -> Outcome:
        with self._lock:
            return self._translator.finish()

    def close(self) -> bytes:
        with self._lock:
            if self._closed:
                return b""
            self._closed = True
        self._host.end_request(self._request_id)
        return b""


class EngineSources:
    """`ChunkSourceFactory` of the `vllm_omni` generator: one engine request per session."""

    encodes = False

    def __init__(self, host: EngineHost, preset: Mapping[str, Any], max_session_seconds: float) -> None:
        self.host = host
        self._preset = dict(preset)
        self._max_session_seconds = max_session_seconds

    def open(self, config: SessionConfig, request_id: str, on_event_failed: EventFailed) -> EngineChunkSource:
        if self.host.dead is not None:
            raise EngineError(f"the engine is not healthy: {self.host.dead}")
        return EngineChunkSource(self.host, config, request_id, self.engine_frames(config), self._preset,
                                 on_event_failed)

    def engine_frames(self, config: SessionConfig) -> int:
        """Frames the engine is asked for: the session's, or for an open-ended session whole chunks
        covering the longest session (it is aborted when the session ends)."""
        if config.num_frames is not None:
            return config.num_frames
        chunks = math.ceil(self._max_session_seconds * config.fps / config.frames_per_chunk)
        return chunks * config.frames_per_chunk

    def close(self) -> None:
        self.host.shutdown()


# --- what an engine output carries ---------------------------------------------------------
def stream_metadata(output: Any) -> Mapping[str, Any]:
    """The chunk's event ids: `multimodal_output["metadata"]["stream"]` (empty when absent)."""
    multimodal = getattr(output, "multimodal_output", None)
    metadata = multimodal.get("metadata") if isinstance(multimodal, Mapping) else None
    stream = metadata.get("stream") if isinstance(metadata, Mapping) else None
    return stream if isinstance(stream, Mapping) else {}


def output_video(output: Any) -> Any:
    """The chunk's frames: `images`, else `multimodal_output["video"]`."""
    images = getattr(output, "images", None)
    if images:
        return images
    multimodal = getattr(output, "multimodal_output", None)
    video = multimodal.get("video") if isinstance(multimodal, Mapping) else None
    if video is None:
        raise EngineError("the engine output carries no video frames")
    return video


def rgb_frames(video: Any) -> np.ndarray:
    """Decoded frames as contiguous uint8 [T, H, W, 3] RGB.

    Accepts what vLLM-Omni outputs: a torch tensor or numpy array [T, H, W, C] or
    [T, C, H, W] (or a batch of one), or a list of frames (PIL images, arrays, tensors).
    Floats are taken as [0, 1], or as [-1, 1] when they leave that range (torch floats:
    always [-1, 1], as vLLM-Omni's own encoder reads them).
    """
    torch_float = False
    if isinstance(video, (list, tuple)):
        if len(video) == 1 and getattr(video[0], "ndim", 0) >= 4:
            return rgb_frames(video[0])
        arrays = [_array(frame) for frame in video]
        torch_float = any(_is_torch_float(frame) for frame in video)
        video = np.stack(arrays) if arrays else np.zeros((0, 0, 0, 3), np.uint8)
    else:
        torch_float = _is_torch_float(video)
        video = _array(video)
    if video.ndim == 5:
        if video.shape[0] != 1:
            raise EngineError(f"expected one video, got a batch of {video.shape[0]}")
        video = video[0]
    if video.ndim != 4:
        raise EngineError(f"expected frames [T, H, W, C], got shape {video.shape}")
    if video.shape[-1] not in (3, 4) and video.shape[1] in (3, 4):
        video = video.transpose(0, 2, 3, 1)
    video = video[..., :3]
    if video.dtype != np.uint8:
        data = video.astype(np.float32)
        if np.issubdtype(video.dtype, np.integer):
            data = data / 255.0
        elif torch_float or (data.size and (data.min() < 0.0 or data.max() > 1.0)):
            data = np.clip(data, -1.0, 1.0) * 0.5 + 0.5
        video = (np.clip(data, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)
    return np.ascontiguousarray(video)


def _is_torch_float(value: Any) -> bool:
    return type(value).__module__.startswith("torch") and bool(getattr(value, "is_floating_point", lambda: False)())


def _array(value: Any) -> np.ndarray:
    if type(value).__module__.startswith("torch"):
        return value.detach().float().cpu().numpy() if value.is_floating_point() else value.detach().cpu().numpy()
    return np.asarray(value)
