"""A ``tritonserver``'s log: where its output goes, and what of it explains a failure.

The server writes to a file (a path, an open file, or a new temp file), or with the target
``"-"`` to this process's standard error: through a pipe that a thread relays line by line,
keeping a bounded tail in memory (the last :data:`TAIL_LINES` lines, and the last error
lines apart, so a long log cannot push the cause out). When the server dies or never gets
ready, :meth:`ServerLog.failure` turns the log into an exception whose message leads with
the error lines and ends with the raw tail.
"""

from __future__ import annotations

import collections
import os
import re
import sys
import tempfile
import threading
from pathlib import Path
from typing import IO, Union

__all__ = ["STDERR", "LogTarget", "ServerLog"]

#: where the server's stdout and stderr go: a path, an open file, None (a new temp file),
#: or :data:`STDERR` (relayed to this process's standard error)
LogTarget = Union[str, "os.PathLike[str]", IO, None]
#: the target that relays the server's output to ``sys.stderr``
STDERR = "-"
#: lines of a relayed log kept in memory for failure messages (each cut at MAX_LINE_BYTES)
TAIL_LINES = 400
ERROR_LINES = 50
MAX_LINE_BYTES = 8192

_ERROR_LINE = re.compile(r"^E\d{4} ")  # glog severity E, e.g. "E1130 08:56:23.459087 ..."


def _is_error(line: str) -> bool:
    return bool(_ERROR_LINE.match(line) or "failed to load" in line or line.startswith("error:"))


class ServerLog:
    """The log target of one server; :meth:`open` once per start, :meth:`close` on stop.

    ``path`` stays set after :meth:`close`, so a stopped server's log can still be read.
    A file passed in open is only flushed, never closed: its owner closes it.
    """

    def __init__(self, target: LogTarget = None) -> None:
        self.target = target
        self.path: Path | None = None
        self._file: IO | None = None
        self._owns_file = False
        # STDERR target: the relay thread of the current run and the bounded tail (kept across runs)
        self._relay: threading.Thread | None = None
        self._lock = threading.Lock()
        self._lines: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self._error_lines: collections.deque[str] = collections.deque(maxlen=ERROR_LINES)

    @property
    def relayed(self) -> bool:
        """Whether the output goes to standard error (the tail is in memory, there is no file)."""
        return isinstance(self.target, str) and self.target == STDERR

    def describe(self) -> str:
        """Where the log is, for a person: a path, or "stderr"."""
        return "stderr" if self.relayed else str(self.path) if self.path is not None else "an open file"

    def open(self, *, temp_prefix: str = "rtvideo-tritonserver-") -> IO:
        """The file to hand to the server process; a new ``<temp_prefix>*.log`` when the target is None
        (the same one again at later starts),
        the write end of the relay's pipe when it is :data:`STDERR` (call :meth:`spawned` after the spawn)."""
        target = self.target
        if self.relayed:
            read_fd, write_fd = os.pipe()
            self._owns_file = True
            self._file = os.fdopen(write_fd, "wb")
            self._relay = threading.Thread(
                target=self._run_relay, args=(read_fd,), name="tritonserver-log", daemon=True
            )
            self._relay.start()
        elif target is None:
            self._owns_file = True
            if self.path is None:
                fd, name = tempfile.mkstemp(prefix=temp_prefix, suffix=".log")
                self.path = Path(name)
                self._file = os.fdopen(fd, "ab")
            else:  # a restart appends to the same temp file, so restarts add no temp files
                self._file = open(self.path, "ab")  # noqa: SIM115 - open for the server's life, closed in close()
        elif isinstance(target, (str, os.PathLike)):
            self.path = Path(target)
            self._owns_file = True
            self._file = open(self.path, "ab")  # noqa: SIM115 - open for the server's life, closed in close()
        else:
            file_name = getattr(target, "name", None)
            if isinstance(file_name, str) and os.path.isfile(file_name):
                self.path = Path(file_name)  # readable back: tail() and errors() can use it
            self._file = target
        return self._file

    def spawned(self) -> None:
        """The server has its copy of the file: a relay's pipe ends when the server's group is gone."""
        if self.relayed:
            self.close()

    def close(self) -> None:
        """Close the file if :meth:`open` opened it."""
        if self._owns_file and self._file is not None:
            self._file.close()
        self._file = None
        self._owns_file = False

    def _run_relay(self, read_fd: int) -> None:
        """Copy the server's output to standard error line by line, remembering the tail."""
        with os.fdopen(read_fd, "rb") as pipe:
            while raw := pipe.readline(MAX_LINE_BYTES):
                line = raw.decode("utf-8", errors="replace")
                if not line.endswith("\n"):
                    line += "\n"
                with self._lock:
                    self._lines.append(line)
                    if _is_error(line):
                        self._error_lines.append(line.rstrip())
                try:
                    sys.stderr.write(line)
                    sys.stderr.flush()
                except (OSError, ValueError):  # stderr closed: keep draining, so the server never blocks
                    pass

    def _drain(self, timeout: float = 1.0) -> None:
        """Give the relay a moment to read what the server wrote before it exited."""
        relay = self._relay
        if relay is not None and relay.is_alive():
            relay.join(timeout)

    def tail(self, max_bytes: int = 8000) -> str:
        """The last ``max_bytes`` of the log, flushed first so nothing we buffered is missing."""
        if self.relayed:
            with self._lock:
                text = "".join(self._lines)
            return text[-max_bytes:] if text else "(nothing logged)"
        if self.path is None or not self.path.is_file():
            return "(no log file to show)"
        try:
            if self._file is not None:
                self._file.flush()
        except (OSError, ValueError):
            pass
        with open(self.path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            return f.read().decode("utf-8", errors="replace")

    def errors(self, max_lines: int = 20) -> str:
        """The log's error lines (glog ``E`` lines, failed loads): the cause, above the tables."""
        if self.relayed:
            with self._lock:
                picked = list(self._error_lines)
        elif self.path is None or not self.path.is_file():
            return ""
        else:
            picked = []
            with open(self.path, "rb") as f:
                for raw in f:
                    line = raw.decode("utf-8", errors="replace").rstrip()
                    if _is_error(line):
                        picked.append(line)
        # The CUDA/NVML complaints of a CPU-only machine are noise here.
        picked = [line for line in picked if "CudaDriverHelper" not in line]
        return "\n".join(picked[-max_lines:])

    def failure(self, what: str, command: list[str]) -> RuntimeError:
        """``what`` went wrong running ``command``: the error lines first, then the raw tail."""
        self._drain()
        errors = self.errors()
        summary = f"\nerrors in the log:\n{errors}" if errors else ""
        return RuntimeError(
            f"{what} (command: {' '.join(command)}){summary}\n"
            f"--- tail of the log ({self.describe()}) ---\n{self.tail()}"
        )
