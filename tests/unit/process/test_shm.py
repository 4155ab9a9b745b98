"""Owner-only shared memory (rtvideo.process.shm): the stub's region found on its command line,
group and other permissions taken off, other files left alone."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from rtvideo.process import shm

#: a stub's command line as Triton 2.51's Python backend starts it
STUB = (
    b"/root/.cache/rtvideo/triton-backends-3417407d9275a30b/python/triton_python_backend_stub\0"
    b"/tmp/repo/realtime_video/1/model.py\0rtvideo_neffffffc_25023_e008d3b0_3670cff5-16a4-4a2a-873b-1f615aeba0b7\0"
    b"1048576\0001048576\00025024\0/root/.cache/rtvideo/python\000336\0realtime_video_0_0\0DEFAULT\0"
)


def test_the_stub_region_is_read_from_its_command_line() -> None:
    assert shm.stub_region(STUB) == "rtvideo_neffffffc_25023_e008d3b0_3670cff5-16a4-4a2a-873b-1f615aeba0b7"
    assert shm.stub_region(b"/usr/bin/python3\0-m\0pytest\0") is None
    assert shm.stub_region(b"triton_python_backend_stub\0model.py\0../../etc/passwd\0") is None
    assert shm.stub_region() is None  # this process is no stub
    assert shm.restrict_own_region() == []


def test_restrict_takes_group_and_other_permissions_off(tmp_path: Path) -> None:
    for name, mode in (("run_a", 0o644), ("run_b", 0o600), ("other", 0o644)):
        (tmp_path / name).write_bytes(b"x")
        os.chmod(tmp_path / name, mode)
    assert shm.restrict_prefix("run_", tmp_path) == ["run_a"]
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()}
    assert modes == {"run_a": 0o600, "run_b": 0o600, "other": 0o644}
    assert shm.restrict(["gone"], tmp_path) == []
    os.symlink(tmp_path / "other", tmp_path / "run_link")
    assert shm.restrict_prefix("run_", tmp_path) == []  # a link is not followed
    assert stat.S_IMODE((tmp_path / "other").stat().st_mode) == 0o644
