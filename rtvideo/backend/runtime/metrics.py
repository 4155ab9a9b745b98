"""Metrics buffered in process memory, so hot paths never pay an IPC call per update.

Triton's custom metrics are IPC calls from the stub, which take turns with every send
(`_IPC` in the model); the model flushes this buffer to them from one thread, a few
times a second. Histograms (`HISTOGRAMS`) are buffered as their observations, bounded
(`MAX_PENDING_OBSERVATIONS` per family between flushes; beyond, the oldest are dropped).

The realtime factor is measured here, not in the proxy: only the model knows how long a chunk
took to make apart from the pacing waits (docs/operations.md, "Playback and model health metrics").
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field

from rtvideo.core.chunks import realtime_factor

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
#: the slots of Triton's sequence batcher this model instance has, and how many its sequences hold
#: (rtvideo/backend/runtime/sequence_slots.py): busy means held >= slots, not a late probe
SEQUENCE_SLOTS = "rtvideo_sequence_slots"
SEQUENCE_SLOTS_HELD = "rtvideo_sequence_slots_held"

#: per chunk: its generation and its encoding, in seconds (histograms beside the totals above)
GENERATE_DURATION = "rtvideo_chunk_generate_duration_seconds"
ENCODE_DURATION = "rtvideo_chunk_encode_duration_seconds"
#: per chunk: its media seconds (frames / fps) per wall second spent making it (generation +
#: encoding, no pacing wait); below 1 the model cannot keep up with real-time playback
REALTIME_FACTOR = "rtvideo_realtime_factor"
#: the generator's memory in all (the GPU's used memory when torch.cuda is available, else the
#: resident memory of the model's process and its render workers), and its growth over the idle
#: model divided by the sessions streaming (an average: a per-session label is never exported)
GENERATOR_MEMORY = "rtvideo_generator_memory_bytes"
SESSION_MEMORY = "rtvideo_generator_session_memory_bytes"

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
    SEQUENCE_SLOTS: ("Slots of Triton's sequence batcher for this model instance (max_candidate_sequences)", "GAUGE"),
    SEQUENCE_SLOTS_HELD: (
        "Slots of the sequence batcher held by open sequences (sessions, unended starts) as the model sees them",
        "GAUGE",
    ),
    GENERATOR_MEMORY: (
        "Generator memory in all: the GPU's used bytes with CUDA, else the model's resident bytes",
        "GAUGE",
    ),
    SESSION_MEMORY: (
        "Generator memory above the idle model, per streaming session (mean; 0 without sessions)",
        "GAUGE",
    ),
}

#: chunk times in seconds (a chunk is about half a second of video)
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: media seconds per wall second; 1.0 is the line between keeping up and falling behind
FACTOR_BUCKETS = (0.25, 0.5, 0.75, 0.9, 1.0, 1.25, 1.5, 2.0, 3.0, 5.0, 10.0, 25.0, 100.0)
#: histogram families the model exports: name → (help, buckets)
HISTOGRAMS: dict[str, tuple[str, tuple[float, ...]]] = {
    GENERATE_DURATION: ("Seconds generating one chunk", DURATION_BUCKETS),
    ENCODE_DURATION: ("Seconds encoding one chunk", DURATION_BUCKETS),
    REALTIME_FACTOR: (
        "Media seconds of a chunk per wall second spent making it (generation + encoding)",
        FACTOR_BUCKETS,
    ),
}
#: observations one histogram keeps between two flushes (the flush runs once a second)
MAX_PENDING_OBSERVATIONS = 4096


@dataclass
class Snapshot:
    """What changed since the last drain: counter increments and current gauge values."""

    increments: dict[Key, float] = field(default_factory=dict)
    gauges: dict[Key, float] = field(default_factory=dict)
    observations: dict[str, list[float]] = field(default_factory=dict)


class BufferedMetrics:
    """Implements the runtime's `Metrics` protocol by accumulating; `drain()` hands the changes over."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending = Snapshot()
        self._observed: dict[str, deque[float]] = {}

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

    def observe_chunk(
        self, generate_seconds: float, encode_seconds: float, frames: int, nbytes: int, fps: float
    ) -> None:
        self._add(
            (CHUNKS, 1),
            (FRAMES, frames),
            (BYTES, nbytes),
            (GENERATE_SECONDS, generate_seconds),
            (ENCODE_SECONDS, encode_seconds),
        )
        self._observe(GENERATE_DURATION, generate_seconds)
        self._observe(ENCODE_DURATION, encode_seconds)
        factor = realtime_factor(frames, fps, generate_seconds, encode_seconds)
        if factor is not None:
            self._observe(REALTIME_FACTOR, factor)

    def set_memory(self, total_bytes: float, per_session_bytes: float) -> None:
        with self._lock:
            self._pending.gauges[(GENERATOR_MEMORY, "", "")] = total_bytes
            self._pending.gauges[(SESSION_MEMORY, "", "")] = per_session_bytes

    def _observe(self, family: str, value: float) -> None:
        with self._lock:
            pending = self._observed.get(family)
            if pending is None:
                pending = self._observed[family] = deque(maxlen=MAX_PENDING_OBSERVATIONS)
            pending.append(value)

    def count_interaction(self, outcome: str) -> None:
        self._add((INTERACTIONS, 1), label=("outcome", outcome))

    def observe_ack(self, seconds: float) -> None:
        self._add((ACKS, 1), (ACK_SECONDS, seconds))

    def count_session_end(self, reason: str) -> None:
        self._add((SESSION_ENDS, 1), label=("reason", reason))

    def set_sequence_slots(self, held: int, slots: int) -> None:
        with self._lock:
            self._pending.gauges[(SEQUENCE_SLOTS_HELD, "", "")] = float(held)
            self._pending.gauges[(SEQUENCE_SLOTS, "", "")] = float(slots)

    def heartbeat(self, unix_time: float) -> None:
        """The model is alive at `unix_time` (the flush calls it once a second)."""
        with self._lock:
            self._pending.gauges[(HEARTBEAT, "", "")] = unix_time

    def drain(self) -> Snapshot:
        with self._lock:
            snapshot, self._pending = self._pending, Snapshot()
            snapshot.observations = {family: list(values) for family, values in self._observed.items() if values}
            self._observed.clear()
        return snapshot
