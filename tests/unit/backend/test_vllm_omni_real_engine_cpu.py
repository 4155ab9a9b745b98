"""The adapter against vLLM-Omni 0.30's REAL engine on a CPU (tests/support/omni_cpu.py): a tiny
random Helios written by diffusers' classes, `AsyncOmni` with a minimal CPU platform patched in,
one session through `EngineSources`/`EngineChunkSource`. Optional and slow (about two minutes,
most of it importing vLLM): it needs an interpreter with vllm 0.30 and vllm-omni 0.30, which the
project's test venv does not have: `omni_python` says where it looks (the environment
scripts/test_real_engine.sh builds, once it exists); without one it is skipped."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import REPO_ROOT

pytestmark = pytest.mark.slow

CHUNKS, FRAMES, SIZE = 6, 33, 64


def omni_python() -> str:
    """`$RTVIDEO_VLLM_OMNI_PYTHON`, else this interpreter when it has vLLM-Omni, else the
    environment scripts/test_real_engine.sh builds (`$RTVIDEO_REAL_ENGINE_ENV`, .venv-real-engine)."""
    given = os.environ.get("RTVIDEO_VLLM_OMNI_PYTHON")
    if given:
        return given
    if importlib.util.find_spec("vllm_omni") is not None and importlib.util.find_spec("vllm") is not None:
        return sys.executable
    built = REPO_ROOT / os.environ.get("RTVIDEO_REAL_ENGINE_ENV", ".venv-real-engine") / "bin" / "python"
    if built.exists():
        return str(built)
    pytest.skip(
        "no interpreter with vllm 0.30 and vllm-omni 0.30: set RTVIDEO_VLLM_OMNI_PYTHON, or run "
        "scripts/test_real_engine.sh --install-only once (it builds .venv-real-engine; scripts/test.sh builds it before pytest)"
    )


def test_the_adapter_drives_the_real_engine_requests_interactions_and_outputs(tmp_path: Path) -> None:
    out = tmp_path / "seen.json"
    run = subprocess.run(
        [omni_python(), "-m", "tests.support.omni_cpu", str(out)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO_ROOT)},
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-6000:]
    seen = json.loads(out.read_text())
    # the engine's output: images=[float32 (1, T, H, W, 3) in [0, 1]], 33 frames a chunk
    raw = seen["raw_outputs"]
    assert [r["shape"] for r in raw] == [[1, FRAMES, SIZE, SIZE, 3]] * CHUNKS
    assert {r["dtype"] for r in raw} == {"float32"} and all(0.0 <= r["min"] <= r["max"] <= 1.0 for r in raw)
    assert [r["finished"] for r in raw] == [False] * (CHUNKS - 1) + [True]
    # what the adapter encodes from it
    assert seen["encoded"] == [{"shape": [FRAMES, SIZE, SIZE, 3], "dtype": "uint8"}] * CHUNKS
    # interactions: held until the engine admitted the request (its start notice), then applied at
    # a later chunk boundary (the boundary after the chunk being generated when it arrives),
    # reported by the engine's metadata
    chunks = seen["chunks"]
    assert [c["index"] for c in chunks] == list(range(CHUNKS))
    first = {
        e: min(c["index"] for c in chunks if e in c["started"])
        for e in ("early", "late")
        if any(e in c["started"] for c in chunks)
    }
    assert first.get("early", 0) >= 1, chunks  # never chunk 0: its prompt was encoded before the event arrived
    assert first.get("late", 0) >= first["early"] + 2, chunks
    for event in ("early", "late"):  # N = 1 and N = 0: the target within the starting chunk
        (c,) = [c for c in chunks if event in c["active"]]
        assert event in c["completed"] and c["progress"][event] == 1.0
    # an event the engine refuses (the parser refuses it from a client; the source forwards it):
    # `interaction_failed` with the engine's words, the session goes on; and its own check, asked directly
    assert seen["failed"] == [
        {"event_id": "empty", "why": "the engine refused the interaction: prompt must be non-empty"}
    ]
    assert seen["direct_refusal"] == "ValueError: prompt must be non-empty"
