"""The backend's composition root: wires settings into a ready `SessionManager` with the chosen
generator; shared by the Triton model and the benchmarks. It sits above runtime/ and the
generators and imports down into them; nothing below imports it."""

from __future__ import annotations

import functools
import logging

from rtvideo.backend import catalog
from rtvideo.backend.loading.settings import BackendSettings
from rtvideo.backend.runtime.capacity import RealtimeCapacity
from rtvideo.backend.runtime.cpu_threads import limit_cpu_threads, resolve_device
from rtvideo.backend.runtime.manager import SessionManager
from rtvideo.backend.runtime.ports import Metrics
from rtvideo.backend.runtime.session import Limits
from rtvideo.backend.runtime.sources import ChunkSourceFactory, GeneratorSources
from rtvideo.backend.vllm_omni.engine import EngineHost
from rtvideo.backend.vllm_omni.engine_timing import PROFILER_ARG

log = logging.getLogger(__name__)


def build_manager(
    settings: BackendSettings,
    model_name: str,
    metrics: Metrics | None = None,
    *,
    idle_timeout_seconds: float | None = None,
    capacity: RealtimeCapacity | None = None,
) -> SessionManager:
    """Load the generator (the slow part of model load) and return the session manager.
    `idle_timeout_seconds`: the sequence batcher's idle limit (`SessionManager`). `capacity`: the
    model's real-time capacity, made from the settings when None (a test passes its own, to
    measure into it as the engine would: `RealtimeCapacity.observe`).

    With `generator=vllm_omni` this starts the engine; when it fails its health check, the
    manager ends live sessions and refuses starts and the health probe (`backend_failed`)."""
    from rtvideo.backend.media.encoder import FragmentedMp4Encoder

    pooled = settings.generator == "builtin" and settings.render_workers > 0
    if capacity is None:
        capacity = RealtimeCapacity(settings.width, settings.height, settings.capacity_setting())
    limit_cpu_threads(settings.torch_threads, blas=not pooled)  # the workers cap their own
    encoder_factory = functools.partial(FragmentedMp4Encoder, limits=catalog.LIMITS[settings.generator])
    host: EngineHost | None = None
    sources: ChunkSourceFactory
    if settings.generator == "vllm_omni":
        from rtvideo.backend.vllm_omni import device_memory
        from rtvideo.backend.vllm_omni.engine import load_factory
        from rtvideo.backend.vllm_omni.source import EngineSources

        # the pipeline times its denoise steps and decodes (`engine_timing`), unless the deployer
        # turned that off: the running capacity then falls back to wall-clock gaps
        engine_args = {PROFILER_ARG: True, **settings.engine_args(), "diffusion_streaming_output": True}
        # before the engine loads its weights: a deployment that cannot fit the GPU is refused with the numbers
        device_memory.check(
            settings.model_rules(),
            settings.engine_args(),
            (settings.width, settings.height),
            settings.vllm_omni_max_request_frames,
            settings.explicit_max_sessions() or 1,
            device_memory.device_total_bytes(settings.device),
        )
        host = EngineHost(
            load_factory(settings.vllm_omni_engine),
            model=settings.vllm_omni_model,
            engine_args=engine_args,
            health_seconds=settings.vllm_omni_health_seconds,
        )
        host.observe_rate = capacity.observe  # measured as the engine runs: no warm-up request at load
        try:
            rule = settings.session_rule(host.max_num_seqs, host.max_num_seqs_from)
        except ValueError:
            host.shutdown()  # the load fails: free the engine it started
            raise
        sources = EngineSources(
            host,
            settings.extra_params(),
            settings.max_session_seconds,
            encoder_factory,
            max_request_frames=settings.vllm_omni_max_request_frames,
            rules=settings.model_rules(),
            output_queue_bytes=settings.vllm_omni_output_queue_bytes,
        )
        log.info(
            "generator=vllm_omni engine=%s model=%s max_sessions=%d (%s) engine_paces=%s settings=%s",
            settings.vllm_omni_engine,
            settings.vllm_omni_model,
            rule.sessions,
            rule.reason,
            host.paces,
            settings,
        )
    else:
        from rtvideo.backend.builtin import warmup
        from rtvideo.backend.builtin.generator import BuiltinGenerator

        device = resolve_device(settings.device)
        rule = settings.session_rule()
        size = (settings.width, settings.height, settings.fps, settings.frames_per_chunk, device)
        if pooled:
            from rtvideo.backend.builtin.render_pool import PooledSources, RenderPool

            options = {"device": device, "fps": settings.fps, "torch_threads": settings.torch_threads}
            pool = RenderPool(settings.render_workers, options, settings.render_priority)
            sources = PooledSources(pool)
            per_process = pool.measure(*size)
        else:
            generator = BuiltinGenerator(device=device, fps=settings.fps)
            sources = GeneratorSources(generator, encoder_factory)
            per_process = warmup.frames_per_second(generator, *size)
        processes = warmup.parallel_processes(settings.render_workers if pooled else 0, device)
        capacity.measured(per_process * processes, "warm-up at load")
        log.info(
            "generator=%s device=%s realtime capacity %.0f fps at %dx%d (%d process(es)) settings=%s",
            settings.generator,
            device,
            capacity.fps or 0.0,
            settings.width,
            settings.height,
            processes,
            settings,
        )
    manager = SessionManager(
        sources=sources,
        capabilities=settings.capabilities(model_name, engine_paces=host is not None and host.paces),
        limits=Limits(
            pacing_lead_chunks=settings.pacing_lead_chunks,
            playback_pacing=settings.playback_pacing,
            max_session_seconds=settings.max_session_seconds,
            stall_timeout_seconds=settings.stall_timeout_seconds,
        ),
        max_sessions=rule.sessions,
        max_sessions_reason=rule.reason,
        metrics=metrics,
        capacity=capacity,
        idle_timeout_seconds=idle_timeout_seconds,
        media=settings.media_policy(),
    )
    if host is not None:
        host.when_dead(manager.backend_failed)  # the manager is built from the host's sources: told after
    return manager
