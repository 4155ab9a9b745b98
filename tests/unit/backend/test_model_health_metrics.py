"""The model's memory gauges (rtvideo/backend/runtime/memory.py): the process tree's resident
memory without CUDA, and the per-session mean as growth over the idle model."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from rtvideo.backend.runtime import memory
from rtvideo.backend.runtime.memory import MemoryProbe, process_tree_rss


def test_the_process_tree_counts_its_children() -> None:
    alone = process_tree_rss(os.getpid())
    assert alone > 10 * 2**20
    child = subprocess.Popen([sys.executable, "-c", "import time; x = bytearray(64 << 20); time.sleep(30)"])
    try:
        for _ in range(100):  # until the child holds its 64 MiB
            if process_tree_rss(os.getpid()) - alone > 60 * 2**20:
                break
            time.sleep(0.05)
        assert process_tree_rss(os.getpid()) - alone > 60 * 2**20
    finally:
        child.kill()
        child.wait()
    assert process_tree_rss(2**22 + 12345) == 0  # no such process


def test_per_session_memory_is_the_growth_over_the_idle_model_per_session(monkeypatch) -> None:
    readings = iter([100.0, 160.0, 220.0, 110.0, 170.0])
    probe = MemoryProbe("cpu")
    monkeypatch.setattr(probe, "total", lambda: int(next(readings)))
    assert probe.read(0) == (100, 0.0)  # the idle model
    assert probe.read(2) == (160, 30.0)
    assert probe.read(3) == (220, 40.0)
    assert probe.read(0) == (110, 0.0)  # idle again: what it keeps now is its idle memory
    assert probe.read(1) == (170, 60.0)


def test_a_failed_reading_is_none_and_without_torch_there_is_no_gpu(monkeypatch) -> None:
    probe = MemoryProbe("cuda:0")
    monkeypatch.setitem(sys.modules, "torch", None)
    assert memory.gpu_used_bytes("cuda:0") is None  # torch never loaded: the process tree instead
    monkeypatch.setattr(probe, "total", lambda: (_ for _ in ()).throw(RuntimeError("driver")))
    assert probe.read(1) is None
