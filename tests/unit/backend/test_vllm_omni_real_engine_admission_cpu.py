"""Admission against vLLM-Omni 0.30's REAL engine on a CPU (tests/support/omni_cpu_admission.py):
the engine's outputs carry its own stage times (denoise, decode) to the adapter, the running
figure is made of them, the session limit says why it is 1, and a start after an unlucky slow
measurement, with no session live, is admitted. Optional and slow (minutes, most of it
importing vLLM), like test_vllm_omni_real_engine_cpu.py, whose interpreter it uses (skipped
without one)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.support.paths import REPO_ROOT
from tests.unit.backend.test_vllm_omni_real_engine_cpu import omni_python

pytestmark = pytest.mark.slow


def test_a_start_after_an_unlucky_slow_measurement_is_admitted_on_the_real_engine(tmp_path: Path) -> None:
    out = tmp_path / "seen.json"
    run = subprocess.run(
        [omni_python(), "-m", "tests.support.omni_cpu_admission", str(out)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO_ROOT)},
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-6000:]
    seen = json.loads(out.read_text())
    # one batching rule: each session asks its own num_frames, so one session at a time, and why
    status = seen["status_at_load"]
    assert status["max_sessions"] == 1 and "one request at a time" in status["max_sessions_reason"], status
    # the engine's own times reach the adapter: cumulative denoise and decode seconds per output
    durations = seen["durations"]
    assert len(durations) == 4, durations  # three chunks, then one
    for output in durations:
        assert any(k.endswith(".diffuse") for k in output) and any(k.endswith(".vae.decode") for k in output), output
    first_three = [sum(v for k, v in d.items() if k.endswith((".diffuse", ".vae.decode"))) for d in durations[:3]]
    assert first_three == sorted(first_three) and first_three[0] > 0  # totals so far: they only grow
    # the running figure is made of them, not of wall-clock gaps
    assert seen["first"][0] == "video.start" and seen["first"][-1] == "session.done", seen["first"]
    assert seen["measured"]["realtime_capacity_from"] == "running", seen["measured"]
    assert seen["measured"]["realtime_capacity_fps"] > 0
    # an unlucky slow figure, far below the session's 16 fps, does not lock the model shut
    assert seen["slow"]["realtime_capacity_fps"] < 1, seen["slow"]
    assert seen["second"][0] == "video.start" and seen["second"][-1] == "session.done", seen["second"]
