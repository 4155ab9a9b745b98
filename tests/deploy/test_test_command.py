"""The README's test command builds vLLM-Omni's real-engine environment before pytest, so that
tests/unit/backend/test_vllm_omni_real_engine_cpu.py finds it and runs instead of being skipped
in every CI run; the checks inside Triton run after a serial pytest or beside its workers, and
their failure fails the run.
pytest runs in parallel workers, a whole group to a worker, each a test session with servers of
its own."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import worker_path
from tests.support.paths import REPO_ROOT


def _lines() -> list[str]:
    return (REPO_ROOT / "scripts" / "test.sh").read_text().splitlines()


def test_the_real_engine_environment_is_built_before_pytest_and_its_checks_count() -> None:
    """Built before pytest; its checks beside pytest's workers, or after a serial pytest."""
    lines = [line.strip() for line in _lines()]
    build = next(i for i, line in enumerate(lines) if "test_real_engine.sh --if-possible --install-only" in line)
    beside = next(i for i, line in enumerate(lines) if line.startswith("setsid -w bash scripts/test_real_engine.sh"))
    pytest_run = next(i for i, line in enumerate(lines) if line.startswith(".venv/bin/python -m pytest"))
    after = next(i for i, line in enumerate(lines) if line == "bash scripts/test_real_engine.sh --if-possible")
    assert build < beside < pytest_run < after
    assert 'if [ "$workers" != 0 ]; then' in lines[build:beside] and lines[beside].endswith(" &")
    assert 'collect "$real_engine" "$beside/real-engine.log"' in lines
    assert lines[after - 2] == 'elif [ "$#" -eq 0 ] && [ "$status" -eq 0 ]; then'
    assert lines[-1] == 'exit "$status"'


def test_the_types_are_checked_beside_pytest_and_their_errors_fail_the_run() -> None:
    """ruff before pytest (seconds); mypy beside it, its report after pytest's, its failure the run's."""
    lines = [line.strip() for line in _lines()]
    ruff = lines.index(".venv/bin/ruff check .")
    mypy = next(i for i, line in enumerate(lines) if line.startswith("bash scripts/typecheck.sh "))
    pytest_run = next(i for i, line in enumerate(lines) if line.startswith(".venv/bin/python -m pytest"))
    waited = lines.index('[ -z "$mypy" ] || collect "$mypy" "$beside/mypy.log"')
    assert ruff < mypy < pytest_run < waited and lines[mypy].endswith(" &")
    collect = lines[lines.index("collect() {") : lines.index("collect() {") + 8]
    assert collect[2] == 'wait "$1"' and collect[5:7] == ['cat "$2"', '[ "$status" -ne 0 ] || status=$code']


def test_pytest_runs_in_workers_a_whole_group_to_each_and_the_arguments_come_last() -> None:
    """A module's fixtures (its proxies, a server it starts) stay in one worker: a worker takes a
    whole group (`--dist loadgroup`; tests/conftest.py gives each test its file's group, or the
    group of the files that share servers), in the order conftest.py sorts them
    (`--no-loadscope-reorder`); the caller's arguments come after the defaults, so `-n 0` or a
    path given to test.sh wins."""
    (line,) = (line for line in _lines() if line.startswith(".venv/bin/python -m pytest"))
    assert ' -n "$workers" --dist loadgroup --no-loadscope-reorder ' in line
    assert "workers=${RTVIDEO_TEST_WORKERS:-0}" in _lines()  # serial unless asked (docs/testing.md)
    assert line.endswith(' "$@"')
    extra = (REPO_ROOT / "pyproject.toml").read_text()
    assert '"pytest-xdist>=' in extra


def test_a_file_named_from_outside_gets_the_workers_name(monkeypatch) -> None:
    """RTVIDEO_TEST_TRITON_LOG names one file; each worker's Triton writes its own."""
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    assert worker_path(Path("/tmp/triton.log")) == Path("/tmp/triton.log")
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    assert worker_path(Path("/tmp/triton.log")) == Path("/tmp/triton-gw1.log")
