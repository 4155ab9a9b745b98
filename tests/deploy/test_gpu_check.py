"""scripts/gpu_check.sh proves each part it is asked for or fails loudly: run here, where there is
no GPU, no tritonserver, no vLLM and no model weights, every part that cannot run makes it exit
non-zero with a message naming the part and what is missing; the built-in part forced onto the
CPU (`--device cpu`), which has all it needs here, passes. Each vLLM-Omni part (Helios-Distilled,
LingBot-World) states first the rules its sessions follow, and they are the rules table's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rtvideo.backend.vllm_omni import model_rules
from rtvideo.backend.vllm_omni.model_rules import FirstFrame, ModelRules
from tests.support.paths import REPO_ROOT

SCRIPT = REPO_ROOT / "scripts" / "gpu_check.sh"


def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in ("TRITONSERVER", "HELIOS_MODEL", "LINGBOT_MODEL", "LINGBOT_DEPLOY_CONFIG")
    }
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
    assert "gpu_check: part lingbot-world CANNOT RUN: " in out.stderr
    assert "3 of 3 part(s) asked for did not prove out" in out.stderr


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


def _rules_line(out: str, part: str) -> str:
    lines = out.splitlines()
    at = lines.index(f"== Part {part}: generator=vllm_omni through Triton")
    assert lines[at + 1].startswith("rules: "), lines[at : at + 2]
    return lines[at + 1]


def _expected(rules: ModelRules, chunks: int) -> list[str]:
    width, height = rules.default_size
    frames = rules.request_length(chunks)
    first = "required (sent)" if rules.first_frame is FirstFrame.REQUIRED else "optional (not sent)"
    return [
        f"rules: {rules.name} {width}x{height} at {rules.default_fps} fps",
        f"{frames} frames (chunks {rules.chunk_frames(frames)}; rule {rules.frames_rule()})",
        f"first frame {first}",
        f"updates {sorted(rules.interactions)}",
        f"first-chunk budget {rules.first_chunk_budget_seconds:g} s",
    ]


def test_each_vllm_omni_part_follows_its_models_rules_from_the_table() -> None:
    """Helios-Distilled (by its model id) and LingBot-World (by the shipped deploy config's
    pipeline class and AR-cache size): the size, frames, first frame, updates, promised fps and
    budget the benchmark would use are the table's, shown even where the part cannot run."""
    out = run("vllm-omni", "lingbot-world", CHUNKS="4")
    assert out.returncode == 1, out.stdout + out.stderr
    helios = _rules_line(out.stdout, "vllm-omni")
    lingbot = _rules_line(out.stdout, "lingbot-world")
    for words in _expected(model_rules.HELIOS_DISTILLED, 4):
        assert words in helios, (words, helios)
    for words in _expected(model_rules.LINGBOT_WORLD, 4):
        assert words in lingbot, (words, lingbot)
    assert "832x480 at 5 fps" in lingbot and "45 frames (chunks [9, 12, 12, 12]" in lingbot  # the docs' figures


def test_the_lingbot_part_here_fails_naming_each_missing_piece() -> None:
    _no_cuda()
    out = run("lingbot-world")
    assert out.returncode == 1, out.stdout + out.stderr
    (line,) = [x for x in out.stderr.splitlines() if "CANNOT RUN" in x]
    assert line.startswith("gpu_check: part lingbot-world CANNOT RUN: ")
    for missing in ("no CUDA device", "vLLM and vllm-omni", "LINGBOT_MODEL="):
        assert missing in line, line


def test_a_deploy_config_of_a_model_without_rules_cannot_run(tmp_path: Path) -> None:
    deploy = tmp_path / "other.yaml"
    deploy.write_text("stages:\n  - model_config: {}\n    model_class_name: SomeOtherPipeline\n")
    out = run("lingbot-world", LINGBOT_MODEL=str(tmp_path), LINGBOT_DEPLOY_CONFIG=str(deploy))
    assert out.returncode == 1
    assert "no rules for model" in out.stderr + out.stdout
    assert "gpu_check: part lingbot-world CANNOT RUN: its rules are not in" in out.stderr
    assert "the weights of" not in out.stderr  # the directory is there: only the rules are missing


def _fake_nvidia_smi(tmp_path: Path, total_mib: int) -> str:
    """A `nvidia-smi` that reports a GPU of `total_mib` and 0 MiB used, 0 % busy."""
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    (fake / "nvidia-smi").write_text(
        f'#!/bin/sh\ncase "$*" in *memory.total*) echo {total_mib} ;; *name,*) echo "Fake GPU, 0, {total_mib} MiB" ;; *) echo 0 ;; esac\n'
    )
    (fake / "nvidia-smi").chmod(0o755)
    return f"{fake}:{os.environ['PATH']}"


@pytest.mark.parametrize(
    "total_mib,config", [(81559, "lingbot_world_h100_fp8.yaml"), (143771, "lingbot_world_stepwise.yaml")]
)
def test_lingbots_deploy_config_follows_the_gpus_memory(tmp_path: Path, total_mib: int, config: str) -> None:
    """An 80 GB H100 gets the FP8 config, an H200 the shipped one (shown even where it cannot run)."""
    out = run("lingbot-world", PATH=_fake_nvidia_smi(tmp_path, total_mib))
    assert f"(LingBot-World deploy config: deploy/gpu/{config}, a GPU of {total_mib} MiB)" in out.stdout


@pytest.mark.triton
@pytest.mark.slow
def test_a_vllm_omni_part_warms_up_then_summarises_against_the_rules_table(tmp_path: Path) -> None:
    """The LingBot-World part against the stand-in engine (OMNI_STANDIN; the pipeline class from
    the chosen deploy config, paced at its published rate): one warm-up session of the real size,
    reported apart, before the budget is asserted; its summary (first chunk, sustained fps, the
    engine's and the device's GPU memory peak, the rules table's figure) repeated under Result."""
    out = run(
        "lingbot-world",
        PATH=_fake_nvidia_smi(tmp_path, 81559),
        OMNI_STANDIN="tests.support.omni_standin:StandInAsyncOmni",
        CHUNKS="5",
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "a stand-in, not vLLM-Omni; no figure here is a GPU figure" in out.stdout
    assert "first session after load (warm-up at 832x480, 9 frames; not held to the budget)" in out.stdout
    result = out.stdout.split("== Result\n", 1)[1].splitlines()
    summary = [line for line in result if line.startswith("summary: LingBot-World")]
    assert summary[0] == "summary: LingBot-World [stand-in engine on a CPU: not GPU figures]"
    text = "\n".join(summary)
    assert "first session after load:" in text and "after warm-up (budget 5 s)" in text
    assert "sustained" in text and "served at 5; reference 5.0: vLLM-Omni issue #7074" in text
    rules = model_rules.LINGBOT_WORLD
    table = rules.reserved_bytes(832, 480, rules.request_length(5), 1, fp8=True)
    assert f"rules table: {table / 1e9:.1f} GB before activations" in text and "weights in FP8" in text
    assert "GPU memory peak: allocated " in text and "engine not measured" not in text
    assert "PASSED lingbot-world" in out.stdout
