"""Where the GPU check's memory peaks come from (benchmarks/bench_vllm_omni.py, `summary:`),
read in the pinned wheel: vLLM-Omni's runner samples the worker's peak per request in step mode
and hands it on every output (`peak_memory_mb`: torch max_memory_reserved), which the model logs
when a request ends (`EngineChunkSource.close`); at DEBUG the runner also logs
max_memory_allocated, in a line the benchmark parses with the wheel's own format."""

from __future__ import annotations

import re
import sys

from tests.support.paths import REPO_ROOT
from tests.support.vllm_omni_wheel import wheel_source

RUNNER = "vllm_omni/diffusion/worker/diffusion_model_runner.py"


def _bench():  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
    try:
        import bench_vllm_omni
    finally:
        sys.path.remove(str(REPO_ROOT / "benchmarks"))
    return bench_vllm_omni


def test_step_mode_samples_the_peak_per_request_and_hands_it_on() -> None:
    runner = wheel_source(RUNNER)
    stepwise = runner[runner.index("    def _execute_stepwise_core(") :]
    stepwise = stepwise[: stepwise.index("\n    def ", 10)]
    assert "current_omni_platform.reset_peak_memory_stats()" in stepwise
    assert "batch_peak_memory_mb = self._sample_peak_memory_mb()" in stepwise
    assert "runner_output.result.peak_memory_mb = max(" in stepwise
    assert "peak_reserved_bytes = current_omni_platform.max_memory_reserved()" in runner
    assert "peak_memory_mb=diffusion_output.peak_memory_mb," in wheel_source("vllm_omni/diffusion/output_formatter.py")


def test_the_benchmark_reads_the_runners_own_debug_line() -> None:
    runner = wheel_source(RUNNER)
    fmt = re.search(r'"(Peak GPU memory \(this request\): [^"]+)"', runner).group(1)  # type: ignore[union-attr]
    assert "GB allocated" in fmt and "peak_allocated_gb = peak_allocated_bytes / (1024**3)" in runner
    line = "DEBUG 12-07 13:00:00 [diffusion_model_runner.py:624] " + fmt % (61.25, 58.5, 2.75, 4.5)
    bench = _bench()
    assert bench.allocated_peak_mib(line) == round(58.5 * 1024) and bench.allocated_peak_mib("") is None
    model_line = "engine request video_stream-ab: GPU memory peak 62720 MiB (832x480, 1449 frames)"
    assert bench.engine_peak_mib(model_line) == 62720
    source = (REPO_ROOT / "rtvideo/backend/vllm_omni/source.py").read_text()
    assert '"engine request %s: GPU memory peak %.0f MiB (%dx%d, %s frames)"' in source  # what the bench parses
