"""scripts/gpu_check.sh proves each part it is asked for or fails loudly: run here, where there is
no GPU, no tritonserver, no vLLM and no Helios weights, every part that cannot run makes it exit
non-zero with a message naming the part and what is missing; the built-in part forced onto the
CPU (`--device cpu`), which has all it needs here, passes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import REPO_ROOT

SCRIPT = REPO_ROOT / "scripts" / "gpu_check.sh"


def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("TRITONSERVER", "HELIOS_MODEL")}
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PYTHON": sys.executable, "SIZES": "32x32", "SECONDS_PER_FIGURE": "0.1", **base, **env},
    )


def _no_cuda() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible here: these tests are for a machine without one")


def test_the_vllm_omni_part_here_fails_naming_each_missing_piece(tmp_path: Path) -> None:
    _no_cuda()
    out = run("vllm-omni", PATH=f"{tmp_path}:/usr/bin:/bin", HELIOS_MODEL=str(tmp_path / "no-weights"))
    assert out.returncode == 1, out.stdout + out.stderr
    (line,) = [x for x in out.stderr.splitlines() if "CANNOT RUN" in x]
    assert line.startswith("gpu_check: part vllm-omni CANNOT RUN: ")
    for missing in ("no CUDA device", "vLLM and vllm-omni", "weights of"):
        assert missing in line, line
    assert "FAILED vllm-omni: cannot run" in out.stdout and "skipped" not in out.stdout + out.stderr


def test_a_tritonserver_that_is_not_there_is_named(tmp_path: Path) -> None:
    _no_cuda()
    out = run("vllm-omni", TRITONSERVER=str(tmp_path / "tritonserver"))
    assert out.returncode == 1
    assert f"TRITONSERVER='{tmp_path / 'tritonserver'}' does not name an executable tritonserver" in out.stderr


def test_the_default_check_asks_for_both_parts_and_fails_without_a_gpu() -> None:
    _no_cuda()
    out = run()
    assert out.returncode == 1, out.stdout + out.stderr
    assert "gpu_check: part builtin CANNOT RUN: this PyTorch sees no CUDA device" in out.stderr
    assert "gpu_check: part vllm-omni CANNOT RUN: " in out.stderr
    assert "2 of 2 part(s) asked for did not prove out" in out.stderr


def test_the_builtin_part_on_the_cpu_passes() -> None:
    out = run("--device", "cpu", "builtin")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "32x32" in out.stdout and "frames/s" in out.stdout and "not GPU figures" in out.stdout
    assert "PASSED builtin on cpu" in out.stdout and "all 1 part(s) asked for passed" in out.stdout


def test_the_builtin_part_fails_when_its_benchmark_fails() -> None:
    out = run("--device", "cpu", "builtin", SIZES="axb")
    assert out.returncode == 1
    assert "gpu_check: part builtin FAILED: bench_generator.py at axb exited non-zero" in out.stderr


def test_without_pytorch_the_builtin_part_cannot_run(tmp_path: Path) -> None:
    (tmp_path / "torch.py").write_text("raise ImportError('no torch on this machine')\n")
    out = run("--device", "cpu", "builtin", PYTHONPATH=str(tmp_path))
    assert out.returncode == 1
    assert "gpu_check: part builtin CANNOT RUN: no PyTorch for" in out.stderr
    assert "no torch on this machine" in out.stderr


def test_the_vllm_omni_part_cannot_be_forced_onto_the_cpu() -> None:
    out = run("--device", "cpu", "vllm-omni")
    assert out.returncode == 1
    assert "it runs on CUDA only (--device cpu)" in out.stderr


def test_an_unknown_part_is_a_usage_error() -> None:
    out = run("bultin")
    assert out.returncode == 2 and "unknown part or option: bultin" in out.stderr
