"""Processes the tests start or look at, read from /proc: the `rtvideo` entry point of this
environment, a process's live descendants, whether one is alive, a model's backend stub, the
scheduling of a process's threads, and ending what a test of `rtvideo serve` left running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

RTVIDEO = Path(sys.executable).parent / "rtvideo"


def descendants(pid: int) -> set[int]:
    """Live (non-zombie) processes below `pid`, from /proc."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rfind(")") + 2 :].split()
            if fields[0] not in ("Z", "X"):
                parents[int(entry)] = int(fields[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return state[state.rfind(")") + 2] not in ("Z", "X")


def end_all(proc: subprocess.Popen, children: set[int]) -> None:
    """After a test of `rtvideo serve`: nothing of it left running, whatever the test did."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    for pid in children:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def terminate(proc: subprocess.Popen, timeout: float = 10) -> None:
    """SIGTERM, then SIGKILL after `timeout` seconds; reaped either way."""
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def stop_serve(proc: subprocess.Popen) -> None:
    """End `rtvideo serve` as an operator would (SIGTERM, 60 s), then anything of it left."""
    pids = descendants(proc.pid)
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def stub_pid(triton: Any, model: str) -> int:
    """The Python-backend stub process that serves `model` (a child of tritonserver)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        parent = int(stat[stat.rfind(")") + 2 :].split()[1])
        if parent == triton.pid and "triton_python_backend_stub" in cmdline and f"/{model}/" in cmdline:
            return int(entry)
    raise AssertionError(f"no stub of {model} under tritonserver {triton.pid}")


def policies(pid: int) -> set[tuple[int, int]]:
    """(scheduling policy, nice) of every thread of `pid`."""
    return {
        (os.sched_getscheduler(int(tid)), os.getpriority(os.PRIO_PROCESS, int(tid)))
        for tid in os.listdir(f"/proc/{pid}/task")
    }
