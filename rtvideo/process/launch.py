"""Start a child process tied to the thread that spawns it, at a given CPU priority.

`python -m rtvideo.process.launch PARENT_PID PRIORITY COMMAND...` sets the death signal and the
priority, then becomes COMMAND (exec: same pid, and every thread COMMAND ever starts inherits
the priority). It takes the place of a `preexec_fn`: Python documents Python code in the forked
child of a multi-threaded process (gRPC's threads, Triton's stub) as unsafe, and with this
launcher the fork runs no Python until the exec.

Imports only the standard library: it runs once per child, before the child's own start-up.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1


def command(argv: list[str], *, python: str = sys.executable, priority: str = "") -> list[str]:
    """`argv` behind this launcher, for a `Popen` from the thread that the child must not outlive
    (on Linux the child gets SIGKILL when that thread ends, even on kill -9 of its process; a
    thread that ends within the launcher's ~30 ms start hands the child to its process instead,
    and it dies with that).
    `priority`: '' (as the parent's), 'idle' (SCHED_IDLE, else nice 19) or a nice value 0-19
    (never below the parent's). Elsewhere than Linux: `argv` as it is."""
    if not sys.platform.startswith("linux"):
        return list(argv)
    return [python, "-m", "rtvideo.process.launch", str(os.getpid()), priority, *argv]


def _lower_priority(priority: str) -> bool:
    """SCHED_IDLE for 'idle', else the nice value, absolute and never below this process's own
    (raising one needs privilege). False when SCHED_IDLE was refused (e.g. by a seccomp
    profile): nice 19 then, the next best."""
    if priority == "idle":
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        except OSError:
            os.setpriority(os.PRIO_PROCESS, 0, 19)
            return False
    elif priority:
        os.setpriority(os.PRIO_PROCESS, 0, max(int(priority), os.getpriority(os.PRIO_PROCESS, 0)))
    return True


def main() -> None:
    parent, priority, argv = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the spawning process died before the death signal was set
        os.kill(os.getpid(), signal.SIGKILL)
    if not _lower_priority(priority):
        print(f"rtvideo.process.launch: SCHED_IDLE was refused; {argv[0]} runs at nice 19", file=sys.stderr)
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    main()
