"""A ``tritonserver``'s log: where its output goes, and what of it explains a failure.

The server writes to a file (a path, an open file, or a new temp file); when it dies
or never gets ready, :meth:`ServerLog.failure` turns that file into an exception whose
message leads with the error lines and ends with the raw tail.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import IO, Optional, Union

__all__ = ["LogTarget", "ServerLog"]

#: where the server's stdout and stderr go: a path, an open file, or None (a new temp file)
LogTarget = Union[str, "os.PathLike[str]", IO, None]

_ERROR_LINE = re.compile(r"^E\d{4} ")  # glog severity E, e.g. "E1130 08:56:23.459087 ..."


class ServerLog:
    """The log target of one server; :meth:`open` once per start, :meth:`close` on stop.

    ``path`` stays set after :meth:`close`, so a stopped server's log can still be read.
    A file passed in open is only flushed, never closed: its owner closes it.
    """

    def __init__(self, target: LogTarget = None) -> None:
        self.target = target
        self.path: Optional[Path] = None
        self._file: Optional[IO] = None
        self._owns_file = False

    def open(self, *, temp_prefix: str = "rtvideo-tritonserver-") -> IO:
        """The file to hand to the server process; a new ``<temp_prefix>*.log`` when the target is None."""
        target = self.target
        if target is None:
            fd, name = tempfile.mkstemp(prefix=temp_prefix, suffix=".log")
            self.path = Path(name)
            self._owns_file = True
            self._file = os.fdopen(fd, "ab")
        elif isinstance(target, (str, os.PathLike)):
            self.path = Path(target)
            self._owns_file = True
            self._file = open(self.path, "ab")
        else:
            name = getattr(target, "name", None)
            if isinstance(name, str) and os.path.isfile(name):
                self.path = Path(name)  # readable back: tail() and errors() can use it
            self._file = target
        return self._file

    def close(self) -> None:
        """Close the file if :meth:`open` opened it."""
        if self._owns_file and self._file is not None:
            self._file.close()
        self._file = None
        self._owns_file = False

    def tail(self, max_bytes: int = 8000) -> str:
        """The last ``max_bytes`` of the log, flushed first so nothing we buffered is missing."""
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
        if self.path is None or not self.path.is_file():
            return ""
        picked = []
        with open(self.path, "rb") as f:
            for raw in f:
                line = raw.decode("utf-8", errors="replace").rstrip()
                if _ERROR_LINE.match(line) or "failed to load" in line or line.startswith("error:"):
                    picked.append(line)
        # The CUDA/NVML complaints of a CPU-only machine are noise here.
        picked = [l for l in picked if "CudaDriverHelper" not in l]
        return "\n".join(picked[-max_lines:])

    def failure(self, what: str, command: list[str]) -> RuntimeError:
        """``what`` went wrong running ``command``: the error lines first, then the raw tail."""
        errors = self.errors()
        summary = f"\nerrors in the log:\n{errors}" if errors else ""
        return RuntimeError(
            f"{what} (command: {' '.join(command)}){summary}\n"
            f"--- tail of {self.path} ---\n{self.tail()}"
        )
