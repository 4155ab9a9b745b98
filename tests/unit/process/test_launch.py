"""rtvideo.process.launch: a child tied to the thread that spawned it, at a given priority, with no
Python run in the forked child (a `preexec_fn` segfaulted there now and then)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from rtvideo.process import launch

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")


def test_a_child_dies_with_the_thread_that_started_it() -> None:
    started: list[subprocess.Popen] = []

    def spawn() -> None:
        started.append(
            subprocess.Popen(
                launch.command(["sh", "-c", "echo running; exec sleep 30"]), stdout=subprocess.PIPE, text=True
            )
        )
        assert started[0].stdout is not None and started[0].stdout.readline() == "running\n"  # past the launcher

    spawner = threading.Thread(target=spawn)
    spawner.start()
    spawner.join()
    assert started[0].wait(10) == -9  # SIGKILL once the spawning thread ended


def test_a_child_becomes_its_command_at_the_priority_asked() -> None:
    report = "import os; print(os.getpid(), os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0))"
    for priority, policy, nice in (("idle", os.SCHED_IDLE, None), ("7", os.SCHED_OTHER, 7), ("", os.SCHED_OTHER, None)):
        proc = subprocess.Popen(
            launch.command([sys.executable, "-c", report], priority=priority), stdout=subprocess.PIPE, text=True
        )
        out, _ = proc.communicate(timeout=30)
        pid, got_policy, got_nice = map(int, out.split())
        assert pid == proc.pid and got_policy == policy  # exec'd in place: the same process
        assert got_nice == (nice if nice is not None else os.getpriority(os.PRIO_PROCESS, 0))
