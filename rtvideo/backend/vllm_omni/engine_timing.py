"""The engine's own time per chunk, read from its outputs, for the running real-time capacity
(`RealtimeCapacity.observe`).

Where vLLM-Omni 0.30.0 keeps it (read in the wheel): with `enable_diffusion_pipeline_profiler`
on, the pipeline's `denoise_step` and `vae.decode` are timed (`diffusion/profiler/
diffusion_pipeline_profiler.py`, the device synchronised around each) under keys ending in
`.diffuse` and `.vae.decode`; the step runner adds each step's time to every request of the
batch and each decode to its request (`diffusion/worker/diffusion_model_runner.py`,
`merge_stage_durations`), and every output carries the request's totals so far
(`attach_stage_durations`). `DiffusionEngine.step_streaming` sums the same keys into
`forward_time_ms` and `vae_decode_time_ms` (`metrics/utils.py`, `extract_diffusion_denoise_ms`,
`extract_diffusion_vae_decode_ms`) beside `scheduler_queue_wait_ms`, but on the engine's own
output only: `AsyncOmni.generate` yields a new `OmniRequestOutput` whose `metrics` are the
orchestrator's (`entrypoints/omni_base.py`, `_process_single_result`) and whose
`stage_durations` are the engine's, which is what reaches this adapter. So a chunk's time is
the growth of (denoise + decode) since the request's previous output: the time the engine
computed for it, without the scheduler's queue wait, the prompt's encoding, or the time our
loop or a busy host took between outputs. Without the profiler the outputs carry no such keys
and the caller falls back to the wall-clock gap between outputs; so it does where a pipeline
does not time its denoising: LingBot-World's names its own profiler targets
(`models/lingbot_world/pipeline.py`: `_prepare_condition_chunk`, `_streaming_decode_chunk`, ...,
not `denoise_step`), so its outputs carry no `.diffuse` key in 0.30.0, and a decode time alone
is not a chunk's time.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: the stage-duration keys of the denoising loop and of the VAE decode (vLLM-Omni's own suffixes)
DENOISE_SUFFIX = ".diffuse"
DECODE_SUFFIX = ".vae.decode"

#: the engine argument that makes the pipeline time its stages (`OmniDiffusionConfig`)
PROFILER_ARG = "enable_diffusion_pipeline_profiler"


def compute_seconds(stage_durations: Any) -> float | None:
    """The request's denoise and decode seconds so far, from an output's `stage_durations`
    (seconds per stage key); None without a denoise time (the profiler off, a pipeline that does
    not time its denoising, a stand-in engine without stage times)."""
    if not isinstance(stage_durations, Mapping):
        return None
    total, denoised = 0.0, False
    for key, value in stage_durations.items():
        if isinstance(key, str) and key.endswith((DENOISE_SUFFIX, DECODE_SUFFIX)):
            try:
                total += float(value)
            except (TypeError, ValueError):
                continue
            denoised = denoised or key.endswith(DENOISE_SUFFIX)
    return total if denoised else None


class ChunkTimer:
    """One request's engine time per chunk: the growth of its cumulative compute time between
    consecutive outputs. Invariant: `_total` is the total of the latest output that had one."""

    def __init__(self) -> None:
        self._total: float | None = None

    def chunk_seconds(self, output: Any) -> float | None:
        """The engine's seconds for the chunk `output` carries; None when it carries no times."""
        total = compute_seconds(getattr(output, "stage_durations", None))
        if total is None:
            return None
        previous, self._total = self._total, total
        return total - (previous or 0.0)
