"""Metrics buffered in process memory, so hot paths never pay an IPC call per update.

Triton's custom metrics are IPC calls from the stub, which take turns with every send
(`_IPC` in the model); the model flushes this buffer to them from one thread, a few
times a second.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

#: (metric family, label name, label value); label name "" = no extra label
Key = tuple[str, str, str]

ACTIVE_SESSIONS = "rtvideo_active_sessions"
PAUSED_SESSIONS = "rtvideo_paused_sessions"
CHUNKS = "rtvideo_chunks_total"
FRAMES = "rtvideo_frames_total"
BYTES = "rtvideo_bytes_total"
GENERATE_SECONDS = "rtvideo_chunk_generate_seconds_total"
ENCODE_SECONDS = "rtvideo_chunk_encode_seconds_total"
ACKS = "rtvideo_acks_total"
ACK_SECONDS = "rtvideo_ack_seconds_total"
INTERACTIONS = "rtvideo_interactions_total"
SESSION_ENDS = "rtvideo_session_ends_total"
#: unix time of the model's last flush: it moves once a second while the model's request path
#: works, also when no sequence slot is free, so a supervisor tells a full model from a dead one
HEARTBEAT = "rtvideo_model_heartbeat_seconds"

#: every family the model exports on Triton's /metrics: name → (help, kind)
FAMILIES: dict[str, tuple[str, str]] = {
    ACTIVE_SESSIONS: ("Sessions streaming now", "GAUGE"),
    PAUSED_SESSIONS: ("Sessions paused now (a proxy's detached session; they hold their slot)", "GAUGE"),
    CHUNKS: ("Media chunks sent", "COUNTER"),
    FRAMES: ("Frames sent", "COUNTER"),
    BYTES: ("Media bytes sent", "COUNTER"),
    GENERATE_SECONDS: ("Time generating chunks", "COUNTER"),
    ENCODE_SECONDS: ("Time encoding chunks", "COUNTER"),
    ACKS: ("Interaction acks sent", "COUNTER"),
    ACK_SECONDS: ("Time from request to ack, in the model", "COUNTER"),
    INTERACTIONS: ("Interactions by outcome", "COUNTER"),
    SESSION_ENDS: ("Session ends by reason", "COUNTER"),
    HEARTBEAT: ("Unix time of the model's last heartbeat (once a second while its request path works)", "GAUGE"),
}


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
            self._pending.gauges[(ACTIVE_SESSIONS, "", "")] = float(count)

    def set_paused_sessions(self, count: int) -> None:
        with self._lock:
            self._pending.gauges[(PAUSED_SESSIONS, "", "")] = float(count)

    def observe_chunk(self, generate_seconds: float, encode_seconds: float, frames: int, nbytes: int) -> None:
        self._add(
            (CHUNKS, 1),
            (FRAMES, frames),
            (BYTES, nbytes),
            (GENERATE_SECONDS, generate_seconds),
            (ENCODE_SECONDS, encode_seconds),
        )

    def count_interaction(self, outcome: str) -> None:
        self._add((INTERACTIONS, 1), label=("outcome", outcome))

    def observe_ack(self, seconds: float) -> None:
        self._add((ACKS, 1), (ACK_SECONDS, seconds))

    def count_session_end(self, reason: str) -> None:
        self._add((SESSION_ENDS, 1), label=("reason", reason))

    def heartbeat(self, unix_time: float) -> None:
        """The model is alive at `unix_time` (the flush calls it once a second)."""
        with self._lock:
            self._pending.gauges[(HEARTBEAT, "", "")] = unix_time

    def drain(self) -> Snapshot:
        with self._lock:
            snapshot, self._pending = self._pending, Snapshot()
        return snapshot
