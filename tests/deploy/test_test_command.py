"""The README's test command builds vLLM-Omni's real-engine environment before pytest, so that
tests/unit/backend/test_vllm_omni_real_engine_cpu.py finds it and runs instead of being skipped
in every CI run; the checks inside Triton run after pytest."""

from __future__ import annotations

from tests.support.paths import REPO_ROOT


def test_the_real_engine_environment_is_built_before_pytest() -> None:
    lines = (REPO_ROOT / "scripts" / "test.sh").read_text().splitlines()
    build = next(i for i, line in enumerate(lines) if "test_real_engine.sh --if-possible --install-only" in line)
    pytest_run = next(i for i, line in enumerate(lines) if line.startswith(".venv/bin/python -m pytest"))
    checks = next(i for i, line in enumerate(lines) if line.strip() == "bash scripts/test_real_engine.sh --if-possible")
    assert build < pytest_run < checks
