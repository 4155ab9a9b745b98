"""The Python backend's shared-memory regions, readable by their owner only.

Triton's Python backend passes every request and response (prompts, video) through a
``/dev/shm`` region per stub, which Boost.Interprocess creates with mode 0644 and then sets
to 0644 with ``fchmod`` whatever the umask: any user of the machine could read it. So each
region is set to 0600 as soon as it is seen: by the process that started tritonserver while it
waits for the server to get ready (`rtvideo.triton.server`), and by the stub itself when the
model initializes (a stub Triton starts again later included). A process of another user that
opened a region in the moment between its creation and that change keeps what it opened: on a
machine shared with users that are not trusted, run Triton in a container of its own (its own
``/dev/shm``) too (docs/security.md).

Standard library only: the stub imports it before anything else of the model.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

#: where POSIX shared memory lives on Linux
SHM_DIR = Path("/dev/shm")
#: what the regions may be: read and write for their owner, nothing for group and others
OWNER_ONLY = 0o600


def restrict(names: Iterable[str], directory: Path = SHM_DIR) -> list[str]:
    """Take every group and other permission off these files of `directory` (their owner keeps
    its own); returns the names changed. A file gone, or not this user's, is left as it is."""
    changed = []
    for name in names:
        path = directory / name
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            mode = stat.S_IMODE(os.fstat(fd).st_mode)
            if mode & 0o077:
                os.fchmod(fd, mode & OWNER_ONLY)
                changed.append(name)
        except OSError:
            pass
        finally:
            os.close(fd)
    return changed


def restrict_prefix(prefix: str, directory: Path = SHM_DIR) -> list[str]:
    """`restrict` every file of `directory` whose name starts with `prefix` (one server's regions)."""
    try:
        names = [n for n in os.listdir(directory) if n.startswith(prefix)]
    except OSError:
        return []
    return restrict(names, directory)


def stub_region(cmdline: bytes | None = None) -> str | None:
    """The region of the Python-backend stub this process is: its command line is
    ``triton_python_backend_stub MODEL_PATH REGION ...``; None in any other process."""
    if cmdline is None:
        try:
            cmdline = Path("/proc/self/cmdline").read_bytes()
        except OSError:
            return None
    argv = [a.decode(errors="replace") for a in cmdline.split(b"\0")]
    if len(argv) < 3 or not os.path.basename(argv[0]).startswith("triton_python_backend_stub"):
        return None
    region = argv[2]
    return region if region and "/" not in region else None


def restrict_own_region() -> list[str]:
    """In a stub: `restrict` its own region (see the module's docstring); elsewhere nothing."""
    region = stub_region()
    return restrict([region]) if region else []
