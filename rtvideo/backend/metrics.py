"""Metrics buffered in process memory, so hot paths never pay an IPC call per update.

Triton's custom metrics are IPC calls from the stub; the model flushes this buffer
to them from one thread, a few times a second: concurrent IPC from many session
threads is slow and has crashed tritonserver (see `_IPC` in the model).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

#: (metric family, label name, label value); label name "" = no extra label
Key = tuple[str, str, str]


@dataclass
class Snapshot:
    """What changed since the last drain: counter increments and current gauge values."""

    increments: dict[Key, float] = field(default_factory=dict)
    gauges: dict[Key, float] = field(default_factory=dict)


class BufferedMetrics:
    """Implements the runtime's `Metrics` protocol by accumulating; `drain()` hands the changes over."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending = Snapshot()

    def _add(self, *updates: tuple[str, float], label: tuple[str, str] = ("", "")) -> None:
        with self._lock:
            for family, amount in updates:
                key = (family, *label)
                self._pending.increments[key] = self._pending.increments.get(key, 0.0) + amount

    def set_active_sessions(self, count: int) -> None:
        with self._lock:
            self._pending.gauges[("rtvideo_active_sessions", "", "")] = float(count)

    def observe_chunk(self, generate_seconds: float, encode_seconds: float, frames: int, nbytes: int) -> None:
        self._add(
            ("rtvideo_chunks_total", 1),
            ("rtvideo_frames_total", frames),
            ("rtvideo_bytes_total", nbytes),
            ("rtvideo_chunk_generate_seconds_total", generate_seconds),
            ("rtvideo_chunk_encode_seconds_total", encode_seconds),
        )

    def count_interaction(self, outcome: str) -> None:
        self._add(("rtvideo_interactions_total", 1), label=("outcome", outcome))

    def observe_ack(self, seconds: float) -> None:
        self._add(("rtvideo_acks_total", 1), ("rtvideo_ack_seconds_total", seconds))

    def count_session_end(self, reason: str) -> None:
        self._add(("rtvideo_session_ends_total", 1), label=("reason", reason))

    def drain(self) -> Snapshot:
        with self._lock:
            snapshot, self._pending = self._pending, Snapshot()
        return snapshot
