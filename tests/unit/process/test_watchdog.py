"""rtvideo.process.watchdog: a stub-like process is killed when its parent ends, even while it holds the
GIL for good (the stub's own teardown deadlocked so after a kill -9, and a watcher thread inside
it could not run)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from rtvideo.process import watchdog
from tests.support.paths import REPO_ROOT
from tests.support.processes import alive

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's /proc and pidfds")

REPO = REPO_ROOT

# The stand-in for Triton's stub: starts its watchdog, says so, then holds the GIL forever
# (PyDLL keeps it through the call), as the deadlocked teardown did.
STUB = textwrap.dedent("""
    import ctypes, os
    from rtvideo.process import watchdog
    guard = watchdog.start()
    print(os.getpid(), guard.pid, flush=True)
    ctypes.PyDLL(None).sleep(600)
""")
# The stand-in for tritonserver: starts the stub and waits.
SERVER = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {STUB!r}]); time.sleep(600)"


#: how long an end may take to be noticed: the checks return as soon as it is, so this only
#: bounds a failure, and a loaded 2-core machine may take seconds to schedule the watchers
GONE_SECONDS = 30.0


def _gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _waiting(guard: int, seconds: float = 60.0) -> None:
    """Until the watchdog holds its pidfd of the server: past its start-up, waiting on it (a
    fixed sleep was not enough on a loaded machine, and then tested the start-up instead)."""
    deadline = time.monotonic() + seconds
    while True:
        with contextlib.suppress(OSError):
            if any(
                os.readlink(f"/proc/{guard}/fd/{fd}") == "anon_inode:[pidfd]" for fd in os.listdir(f"/proc/{guard}/fd")
            ):
                return
        assert time.monotonic() < deadline, f"the watchdog {guard} holds no pidfd after {seconds:g} s"
        time.sleep(0.02)


def _server() -> tuple[subprocess.Popen, int, int]:
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert server.stdout is not None
    stub, guard = map(int, server.stdout.readline().split())
    return server, stub, guard


def _end(*pids: int) -> None:
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_the_stub_dies_with_its_server_while_it_holds_the_gil() -> None:
    server, stub, guard = _server()
    try:
        _waiting(guard)  # the watchdog is past its start-up, waiting on the server
        assert alive(stub) and alive(guard)
        server.kill()
        server.wait()
        assert _gone(stub, GONE_SECONDS), "the stub outlived its server"
        assert _gone(guard, GONE_SECONDS), "the watchdog outlived its stub"
    finally:
        _end(stub, guard)


def test_the_watchdog_dies_with_its_stub_and_leaves_the_server_alone() -> None:
    server, stub, guard = _server()
    try:
        os.kill(stub, signal.SIGKILL)
        assert _gone(guard, GONE_SECONDS), "the watchdog outlived its stub"
        assert server.poll() is None
    finally:
        server.kill()
        server.wait()
        _end(stub, guard)


@pytest.mark.parametrize("pidfds", [True, False], ids=["pidfd", "polling"])
def test_waiting_ends_when_the_parent_does(pidfds: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if not pidfds:

        def no_pidfds(pid: int) -> int:
            raise OSError(38, "Function not implemented")

        monkeypatch.setattr(os, "pidfd_open", no_pidfds)
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, time; "
            "p = subprocess.Popen(['sleep', '600']); print(p.pid, flush=True); time.sleep(600)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    try:
        waiter = threading.Thread(target=watchdog.wait_for_end, args=(parent.pid, child), daemon=True)
        waiter.start()
        waiter.join(0.5)
        assert waiter.is_alive(), "returned while the parent lives"
        parent.kill()
        parent.wait()
        waiter.join(GONE_SECONDS)
        assert not waiter.is_alive(), "still waiting after the parent ended"
        # A pid that is not (or no longer) the child's parent: nothing to wait for.
        watchdog.wait_for_end(os.getpid(), child)
    finally:
        _end(child)
