"""The Python backend's shared-memory files of the servers this package starts: their names
(the launcher's PID namespace and pid in each, so a launcher knows its own) and their removal,
on a server's stop and, for launchers that no longer run, at the next start."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

log = logging.getLogger(__name__)

#: where POSIX shared memory lives on Linux
SHM_DIR = Path("/dev/shm")
#: Python-backend shared-memory names: ``rtvideo_n<PID namespace>_<launcher pid>_<8 hex>_<Triton's
#: suffix>``; a name without ``n<...>_`` comes from an older rtvideo or a host whose namespace is unknown
_SHM_NAME = re.compile(r"^rtvideo_(?:n([0-9a-f]+)_)?(\d+)_[0-9a-f]{8}_")


def pid_namespace() -> str:
    """This process's PID namespace (its inode, hex), '' where it cannot be told. Containers that
    share /dev/shm (`--ipc=host`) see each other's files but not each other's pids."""
    try:
        return format(os.stat("/proc/self/ns/pid").st_ino, "x")
    except OSError:
        return ""


def shm_prefix_of(pid: int) -> str:
    """The start of the shared-memory names of the servers a launcher `pid` (here) started."""
    namespace = pid_namespace()
    return f"rtvideo_n{namespace}_{pid}_" if namespace else f"rtvideo_{pid}_"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def remove_shm_files(names: list[str]) -> list[str]:
    """Remove these files of `SHM_DIR`; returns the names removed (one already gone is no error)."""
    removed = []
    for name in names:
        try:
            (SHM_DIR / name).unlink()
            removed.append(name)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("could not remove %s: %s", SHM_DIR / name, exc)
    return removed


def clean_stale_shm() -> list[str]:
    """Remove the Python backend's ``/dev/shm`` files whose launcher no longer runs; returns the
    names removed. A stub killed with ``kill -9`` (or a launcher killed the same way) leaves its
    regions behind. Only files of this PID namespace are judged: another's pids mean nothing here."""
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return []
    here = pid_namespace()
    stale = [
        n
        for n in names
        if (m := _SHM_NAME.match(n)) and (m.group(1) or here) == here and not _pid_alive(int(m.group(2)))
    ]
    removed = remove_shm_files(stale)
    if removed:
        log.info("removed %d stale shared-memory file(s) of launchers that are gone", len(removed))
    return removed
