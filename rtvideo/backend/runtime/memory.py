"""The generator's memory, for the model's gauges (docs/operations.md, "Playback and model health metrics").

In all: the GPU's used bytes when torch.cuda is available (the device the model runs on; a
KIND_GPU instance has its GPU), else the resident bytes of the model's process and every
process under it (render workers). Per session: the growth over the first reading (the idle
model, taken at load) divided by the sessions streaming, a mean; never a per-session label.

Read from the metrics flush thread once a second; a reading that fails gives None (the
gauges keep their last value) rather than an exception in that thread.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _rss(pid: int) -> int:
    """Resident bytes of one process (0 when it is gone)."""
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return found
    for task in tasks:
        try:
            found += [int(child) for child in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue
    return found


def process_tree_rss(root: int) -> int:
    """Resident bytes of `root` and every process under it."""
    total, todo, seen = 0, [root], set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        total += _rss(pid)
        todo += _children(pid)
    return total


def gpu_used_bytes(device: str) -> int | None:
    """Used bytes of the GPU `device` names (`cuda`, `cuda:N`); None without a loaded torch with CUDA.
    torch is not imported here: a model that never loaded it has no GPU memory of its own."""
    torch = sys.modules.get("torch")
    device = "cuda" if device == "auto" else device
    if torch is None or not device.startswith("cuda") or not torch.cuda.is_available():
        return None
    index = int(device.split(":", 1)[1]) if ":" in device else torch.cuda.current_device()
    free, total = torch.cuda.mem_get_info(index)
    return int(total - free)


class MemoryProbe:
    """Readings of the generator's memory: (in all, per streaming session)."""

    def __init__(self, device: str = "cpu", pid: int | None = None) -> None:
        self._device = device
        self._pid = os.getpid() if pid is None else pid
        self._idle: int | None = None

    def total(self) -> int:
        used = gpu_used_bytes(self._device)
        return used if used is not None else process_tree_rss(self._pid)

    def read(self, sessions: int) -> tuple[int, float] | None:
        try:
            total = self.total()
        except (OSError, RuntimeError, ValueError):  # a driver error must not end the metrics thread
            return None
        if self._idle is None or sessions == 0:
            self._idle = total  # what the model holds with no session (weights, caches kept)
        per_session = max(0, total - self._idle) / sessions if sessions > 0 else 0.0
        return total, per_session
