"""A process that kills this one when this one's parent ends: Triton's stub with tritonserver.

Triton's stub notices a dead tritonserver (its health thread, every 300 ms) and then runs its
own teardown, which takes the GIL and can deadlock, so the stub and its render workers stay.
A watcher thread inside the stub would need that GIL too. So the watchdog is a process of its
own: `start()` runs `python -m rtvideo.process.watchdog PARENT` through `rtvideo.process.launch`,
so it dies with the process that started it, and the kill needs nothing from that process.

Imports only the standard library: every stub starts one, so it stays light.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time

from rtvideo.process import launch

_POLL_SECONDS = 0.2  # without pidfds (Linux < 5.3) only


def start(python: str = sys.executable) -> subprocess.Popen:
    """Kill this process (SIGKILL) as soon as its current parent ends."""
    argv = [python, "-m", "rtvideo.process.watchdog", str(os.getppid())]
    return subprocess.Popen(launch.command(argv, python=python), stdin=subprocess.DEVNULL, close_fds=True)


def _parent_of(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            text = stat.read()
    except OSError:
        return -1
    return int(text[text.rfind(")") + 2 :].split()[1])


def wait_for_end(watched: int, target: int) -> None:
    """Return once `watched` is no longer `target`'s parent (it ended: `target` was re-parented)."""
    try:
        handle = os.pidfd_open(watched)
    except ProcessLookupError:
        return
    except OSError:  # no pidfds here
        while _parent_of(target) == watched:
            time.sleep(_POLL_SECONDS)
        return
    # Still the target's parent after the open: the handle is that process, not a reused pid.
    if _parent_of(target) == watched:
        select.select([handle], [], [])  # readable once it has ended


def main() -> None:
    watched, target = int(sys.argv[1]), os.getppid()
    wait_for_end(watched, target)
    # The target's pid cannot have been reused: this process dies with it (rtvideo.process.launch).
    os.kill(target, signal.SIGKILL)


if __name__ == "__main__":
    main()
