"""The parallel workers' groups (tests/conftest.py, `--dist loadgroup`): the tests of one group run
on one worker, whatever their files. pytest 9.2 broke this silently (its node ids no longer take
the group pytest-xdist 3.8 appends, and every test went to any worker: the files that share a
tritonserver pair started one on each), hence pyproject.toml's bound on pytest and this check."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TEST = """
import os, pytest

@pytest.mark.xdist_group("one")
@pytest.mark.parametrize("n", range(6))
def test_where(n):
    with open(os.environ["WHERE"], "a") as f:
        f.write(f"{__name__} {os.environ['PYTEST_XDIST_WORKER']}\\n")
"""


def test_a_group_runs_on_one_worker(tmp_path: Path) -> None:
    for name in ("test_a.py", "test_b.py"):
        (tmp_path / name).write_text(TEST)
    where = tmp_path / "where.txt"
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider", "."],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={"WHERE": str(where), "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stdout + out.stderr
    lines = where.read_text().splitlines()
    assert len(lines) == 12 and {line.split()[0] for line in lines} == {"test_a", "test_b"}
    assert len({line.split()[1] for line in lines}) == 1, lines  # all twelve on one worker
