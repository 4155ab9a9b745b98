"""`python -m rtvideo.backend.loading.derive`, as the GPU image's build runs it: the shipped model
with the given parameters, refused (exit 2, the reason in one line) when the model would refuse
them at load."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from rtvideo.triton.model_repo import read_parameters


def derive(out: Path, *params: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rtvideo.backend.loading.derive", str(out), "--name", "m", *params],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_parameters_are_written_when_the_model_takes_them(tmp_path: Path) -> None:
    done = derive(tmp_path, "width=320", "max_sessions=2")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(tmp_path / "m")
    written = read_parameters(tmp_path / "m")
    assert (written["width"], written["max_sessions"]) == ("320", "2")


def test_a_value_the_model_would_refuse_fails_the_build(tmp_path: Path) -> None:
    done = derive(tmp_path, "width=33")
    assert done.returncode == 2
    assert "error: model parameters width/height/fps" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "m").exists()
