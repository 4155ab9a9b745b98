"""benchmarks/bench_vllm_omni.py --assert, the GPU check's vLLM-Omni part, run here against the
stand-in engine (tests/support/omni_standin.py) in a real tritonserver, with a fake `nvidia-smi`
(0 MiB used, 0 % busy): paced as each model runs by its published rate, every assertion holds,
for Helios-Distilled and for LingBot-World (its rules read from the table: 832x480 only, a first
frame on every request, n % 12 == 9 frames, camera updates; the stand-in refuses as its pipeline
does); an engine that ends the bounded request before an update can reach it fails the update
assertions, listing each, and exits 1; an engine slower than the model's documented fps fails the
real-time check. Proves the benchmark's own logic, not the GPU path (docs/vllm-omni.md)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rtvideo.backend.vllm_omni import model_rules
from rtvideo.backend.vllm_omni.model_rules import FirstFrame
from rtvideo.backend.vllm_omni.presets import vllm_omni_preset
from tests.support.paths import REPO_ROOT, STANDIN_ENGINE

pytestmark = [pytest.mark.triton, pytest.mark.slow]

BENCH = REPO_ROOT / "benchmarks" / "bench_vllm_omni.py"
HELIOS_SMALL = ("--chunks", "4", "--size", "128x128")


def bench(
    tmp_path: Path, *flags: str, shape: tuple[str, ...] = HELIOS_SMALL, **engine_args: object
) -> subprocess.CompletedProcess[str]:
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    (fake / "nvidia-smi").write_text("#!/bin/sh\necho 0\n")
    (fake / "nvidia-smi").chmod(0o755)
    return subprocess.run(
        [
            sys.executable,
            str(BENCH),
            "--engine",
            STANDIN_ENGINE,
            "--engine-args",
            json.dumps(engine_args),
            *shape,
            *(flags or ("--assert",)),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO_ROOT,
        env={**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"},
    )


def test_paced_as_helios_every_assertion_holds_and_the_preset_reaches_the_engine(tmp_path: Path) -> None:
    record = tmp_path / "calls.jsonl"
    out = bench(tmp_path, record=str(record))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "ASSERTION FAILED" not in out.stdout
    assert "every assertion passed against the stand-in" in out.stdout and "not a GPU proof" in out.stdout
    calls = [json.loads(line) for line in record.read_text().splitlines()]
    generates = [c for c in calls if c["call"] == "generate"]
    # first a warm-up session of the real size and preset (one chunk), reported apart
    warm, measured = generates[0], generates[1]
    assert (warm["width"], warm["height"], warm["num_frames"], warm["extra_args"]) == (
        128,
        128,
        33,
        measured["extra_args"],
    )
    assert "first session after load (warm-up at 128x128, 33 frames; not held to the budget)" in out.stdout
    # the model's real-time preset ("auto", as gpu_check.sh passes it), the asked size and length
    preset = vllm_omni_preset("BestWishYsh/Helios-Distilled")
    assert measured["extra_args"] == preset["extra_params"] and measured["guidance_scale"] == 1.0
    assert (measured["width"], measured["height"], measured["num_frames"]) == (128, 128, 4 * 33)
    # both updates were forwarded once the engine had admitted their request (its start notice;
    # the early one may beat the first frames, as on vLLM-Omni), and the stop and disconnect aborted
    assert [c["event_id"] for c in calls if c["call"] == "submit"] == ["update", "early"]
    noticed: set[str] = set()
    for call in calls:
        if call["call"] == "start_notice":
            noticed.add(call["request_id"])
        elif call["call"] == "submit":
            assert call["request_id"] in noticed, call
    assert {c["request_id"] for c in calls if c["call"] == "abort"} >= {g["request_id"] for g in generates[3:]}
    _check_summary(out.stdout, model_rules.HELIOS_DISTILLED.name)


def _check_summary(stdout: str, name: str) -> None:
    """The per-model summary: first chunk (warm and first after load), sustained fps, GPU memory
    peaks against the rules table; the stand-in's engine peak read back from Triton's log."""
    lines = [line for line in stdout.splitlines() if line.startswith(f"summary: {name}")]
    assert lines[0] == f"summary: {name} [stand-in engine on a CPU: not GPU figures]", lines
    text = "\n".join(lines)
    assert re.search(
        r"first chunk \d+\.\d+ s after warm-up \(budget \d+ s\); first session after load: \d+\.\d+ s", text
    )
    assert re.search(r"sustained \d+\.\d+ fps after the first chunk", text)
    # the stand-in reports a peak per output (as the runner does); the model logs it, the bench reads it
    assert re.search(r"GPU memory peak: allocated not measured \(torch max_memory_allocated", text), text
    assert re.search(r"\), engine \d+\.\d+ GB \(\d+ % of the table's\)", text), text
    assert "device 0.0 GB" in text and "rules table: " in text and "GB before activations" in text


def test_the_engine_peak_is_read_from_the_models_log_line() -> None:
    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
    try:
        import bench_vllm_omni
    finally:
        sys.path.remove(str(REPO_ROOT / "benchmarks"))
    log = (
        "2026-12-07 I rtvideo.backend.vllm_omni.source engine request video_stream-ab: GPU memory peak 51234 MiB (640x384, 165 frames)\n"
        "noise engine request x: GPU memory peak 9 MiB\n"
    )
    assert bench_vllm_omni.engine_peak_mib(log) == 51234 and bench_vllm_omni.engine_peak_mib("nothing") is None


def test_an_engine_that_ends_the_request_before_an_update_arrives_fails_loudly(tmp_path: Path) -> None:
    # a one-chunk request: no boundary for any update, however early the engine takes it (with
    # more chunks at no pace, whether an update beats the engine's end is a race)
    out = bench(
        tmp_path, "--assert", shape=("--chunks", "1", "--size", "128x128"), chunk_seconds=0, first_chunk_seconds=0
    )
    assert out.returncode == 1, out.stdout + out.stderr
    assert "ASSERTION FAILED: the update is started at a boundary after chunk 0" in out.stdout
    assert "ASSERTION FAILED: the early update is started" in out.stdout
    assert "assertion(s) failed:" in out.stderr and "- the early update is started" in out.stderr


def test_an_engine_slower_than_real_time_fails_with_one_line_per_reason(tmp_path: Path) -> None:
    """A first chunk after 6 s (Helios-Distilled's budget: 5 s) and 33 frames every 3 s (11 fps
    for a 16 fps session): `--realtime` exits non-zero naming both."""
    out = bench(
        tmp_path, "--realtime", shape=("--chunks", "2", "--size", "128x128"), chunk_seconds=3, first_chunk_seconds=6
    )
    assert out.returncode == 1, out.stdout + out.stderr
    assert "REAL TIME FAILED: Helios-Distilled: time to first chunk" in out.stdout
    assert "REAL TIME FAILED: Helios-Distilled: delivered" in out.stdout and "below the session's 16 fps" in out.stdout
    assert "bench_vllm_omni: not real time:" in out.stderr


def test_realtime_problems_name_the_budget_and_the_rate() -> None:
    from rtvideo.backend.vllm_omni.model_rules import HELIOS_DISTILLED, LINGBOT_WORLD

    assert HELIOS_DISTILLED.realtime_problems(1.5, 19.0, 16) == []
    assert HELIOS_DISTILLED.realtime_problems(5.5, 19.0, 16) == [
        "Helios-Distilled: time to first chunk 5.5 s is over its budget of 5 s"
    ]
    assert LINGBOT_WORLD.realtime_problems(1.0, 15.9, 16) == [
        "LingBot-World: delivered 15.9 fps is below the session's 16 fps"
    ]
    assert len(HELIOS_DISTILLED.realtime_problems(None, None, 16)) == 2  # nothing measured is no pass
    # a session asking for less than the model is documented to serve still fails below the promise
    (problem,) = LINGBOT_WORLD.realtime_problems(1.0, 4.5, 3)
    assert problem.startswith("LingBot-World: delivered 4.5 fps is below the 5 fps it is documented to serve")
    assert "issue #7074" in problem and LINGBOT_WORLD.realtime_problems(1.0, 5.0, 5) == []


@pytest.mark.parametrize("rules", [r for r in model_rules.MODELS if r.pipeline_classes], ids=lambda r: r.name)
def test_the_sessions_follow_the_tables_rules_for_every_model(rules: model_rules.ModelRules) -> None:
    """`--show-rules` (no Triton, no GPU): the size, fps, frames, first frame and updates the
    sessions use are the table's, for each model in it."""
    engine_args = json.dumps({"model_class_name": rules.pipeline_classes[0]})
    out = subprocess.run(
        [sys.executable, str(BENCH), "--show-rules", "--chunks", "3", "--model", "m", "--engine-args", engine_args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    assert out.returncode == 0, out.stdout + out.stderr
    width, height = rules.default_size
    frames = rules.request_length(3)
    assert rules.valid_frames(frames) and len(rules.chunk_frames(frames)) == 3
    required = rules.first_frame is FirstFrame.REQUIRED
    (line,) = out.stdout.splitlines()
    assert line.startswith(f"rules: {rules.name} {width}x{height} at {rules.default_fps} fps"), line
    assert f"{frames} frames (chunks {rules.chunk_frames(frames)}; rule {rules.frames_rule()})" in line
    assert f"first frame {'required (sent)' if required else 'optional (not sent)'}" in line
    assert f"updates {sorted(rules.interactions)}" in line


def test_lingbot_world_by_its_rules_every_assertion_holds(tmp_path: Path) -> None:
    """LingBot-World's rules from the table, paced at its published rate (12 frames every 2.4 s):
    the stand-in, which refuses what LingBot's pipeline refuses, gets 832x480 requests of a valid
    frame count with the first frame, and camera targets; every assertion holds, and the engine's
    rate from the in-band timing is printed beside the client's (the baseline)."""
    rules = model_rules.LINGBOT_WORLD
    record = tmp_path / "calls.jsonl"
    out = bench(
        tmp_path,
        shape=("--chunks", "5", "--model", "m"),
        record=str(record),
        model_class_name=rules.pipeline_classes[0],
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "ASSERTION FAILED" not in out.stdout and "not a GPU proof" in out.stdout
    assert "stand-in paced at 2.40 s per chunk" in out.stdout
    assert "baseline, same session: the engine made" in out.stdout
    calls = [json.loads(line) for line in record.read_text().splitlines()]
    assert not [c for c in calls if c["call"] == "pipeline_refused"]
    generates = [c for c in calls if c["call"] == "generate"]
    for g in generates:
        assert (g["width"], g["height"]) in rules.exact_sizes and rules.valid_frames(g["num_frames"])
        assert g["image_shape"] is not None and g["num_inference_steps"] == rules.steps  # first frame, 4 steps
        assert g["fps"] == rules.default_fps
    assert generates[0]["num_frames"] == rules.request_length(1) == 9  # the warm-up session, reported apart
    assert generates[1]["num_frames"] == rules.request_length(5) == 57
    _check_summary(out.stdout, rules.name)
    submits = [c for c in calls if c["call"] == "submit"]
    assert [c["event_id"] for c in submits] == ["update", "early"]
    assert all(c["multi_modal_data"]["camera"]["mode"] == "target" and c["prompt"] is None for c in submits)
    preset = vllm_omni_preset("m", rules)
    assert generates[0]["extra_args"] == preset["extra_params"]


def test_lingbot_world_slower_than_its_documented_fps_fails(tmp_path: Path) -> None:
    """12 frames every 3 s (4 fps) for LingBot-World, documented at 5: the real-time check fails."""
    out = bench(
        tmp_path,
        "--realtime",
        shape=("--chunks", "3", "--model", "m"),
        model_class_name="LingBotWorldCausalDMDPipeline",
        chunk_seconds=3,
        first_chunk_seconds=2,
    )
    assert out.returncode == 1, out.stdout + out.stderr
    assert "REAL TIME FAILED: LingBot-World: delivered" in out.stdout and "below the session's 5 fps" in out.stdout
