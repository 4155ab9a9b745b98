"""vLLM-Omni 0.32's `streaming_pacing` (docs/protocol.md §2.1, §7 "Pacing to the playhead").

0.32.0rc1's `StreamingPacingConfig` (`entrypoints/openai/protocol/videos.py`, `extra="forbid"`):
`enabled` (true), `mode` (only `"client_playhead"`), `max_lead_ms` (1000, in (0, 10000]),
`max_output_bytes` (64 MiB, a positive integer), `idle_timeout_s` (30, in (0, 86400]).
`streaming_buffer_seconds` is its alias (`max_lead_ms = seconds * 1000`); a start with both is
refused. Its meaning (`diffusion/diffusion_engine.py`, `_playback_blocked`): the next chunk is
not generated while `generated + next_chunk - played > max_lead`, where `played` is the
player's reported position (`session.playback`), never beyond what was generated and never
backwards; a session blocked on its client for `idle_timeout_s` ends; an output larger than
`max_output_bytes` ends the session. Each chunk of a paced session carries
`output_chunk_index` and `pacing` `{lead_seconds, wait_seconds, retained_bytes}`.

Pure: no clock is read here; times are passed in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from rtvideo.core.errors import ErrorCode, ProtocolError
from rtvideo.core.fields import json_kind

STREAMING_PACING = "streaming_pacing"
CLIENT_PLAYHEAD = "client_playhead"
DEFAULT_MAX_LEAD_MS = 1000.0
MAX_MAX_LEAD_MS = 10_000.0
DEFAULT_MAX_OUTPUT_BYTES = 64 * 1024 * 1024
MAX_OUTPUT_BYTES_LIMIT = 2**63 - 1
DEFAULT_IDLE_TIMEOUT_S = 30.0
MAX_IDLE_TIMEOUT_S = 86_400.0
#: chunk metadata of a paced session (0.32's `output_formatter.py`)
OUTPUT_CHUNK_INDEX = "output_chunk_index"
PACING = "pacing"
_FIELDS = ("enabled", "mode", "max_lead_ms", "max_output_bytes", "idle_timeout_s")
#: 0.32 compares leads with this tolerance (`_playback_blocked`)
_EPSILON = 1e-9


@dataclass(frozen=True)
class StreamingPacing:
    """A validated `streaming_pacing` (or its alias), defaults resolved."""

    enabled: bool = True
    mode: str = CLIENT_PLAYHEAD
    max_lead_ms: float = DEFAULT_MAX_LEAD_MS
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S

    @property
    def max_lead_seconds(self) -> float:
        return self.max_lead_ms / 1000.0

    def to_json(self) -> dict[str, Any]:
        return {
            "enabled": self.enabled,
            "mode": self.mode,
            "max_lead_ms": self.max_lead_ms,
            "max_output_bytes": self.max_output_bytes,
            "idle_timeout_s": self.idle_timeout_s,
        }


def _positive(value: Any, name: str, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ProtocolError(
            ErrorCode.INVALID_START, f"streaming_pacing.{name} must be a number, not {json_kind(value)}"
        )
    if not 0 < value <= high:
        raise ProtocolError(ErrorCode.INVALID_START, f"streaming_pacing.{name} must be > 0 and at most {high:g}")
    return float(value)


def parse_streaming_pacing(value: Any) -> StreamingPacing:
    """`session.start`'s `streaming_pacing` as 0.32 validates it; any fault is `invalid_start`."""
    if not isinstance(value, dict):
        raise ProtocolError(ErrorCode.INVALID_START, f"streaming_pacing must be an object, not {json_kind(value)}")
    unknown = sorted(str(key)[:64] for key in value if key not in _FIELDS)
    if unknown:
        raise ProtocolError(ErrorCode.INVALID_START, f"unknown streaming_pacing field(s): {', '.join(unknown)}")
    out: dict[str, Any] = {}
    if "enabled" in value:
        if not isinstance(value["enabled"], bool):
            raise ProtocolError(ErrorCode.INVALID_START, "streaming_pacing.enabled must be true or false")
        out["enabled"] = value["enabled"]
    if "mode" in value and value["mode"] != CLIENT_PLAYHEAD:
        raise ProtocolError(ErrorCode.INVALID_START, f"streaming_pacing.mode must be {CLIENT_PLAYHEAD!r}")
    if "max_lead_ms" in value:
        out["max_lead_ms"] = _positive(value["max_lead_ms"], "max_lead_ms", MAX_MAX_LEAD_MS)
    if "max_output_bytes" in value:
        size = value["max_output_bytes"]
        if isinstance(size, bool) or not isinstance(size, int):  # 0.32: strict int
            raise ProtocolError(ErrorCode.INVALID_START, "streaming_pacing.max_output_bytes must be an integer")
        if not 0 < size <= MAX_OUTPUT_BYTES_LIMIT:
            raise ProtocolError(ErrorCode.INVALID_START, "streaming_pacing.max_output_bytes must be positive")
        out["max_output_bytes"] = size
    if "idle_timeout_s" in value:
        out["idle_timeout_s"] = _positive(value["idle_timeout_s"], "idle_timeout_s", MAX_IDLE_TIMEOUT_S)
    return StreamingPacing(**out)


def from_buffer_seconds(seconds: float) -> StreamingPacing:
    """The alias: `streaming_buffer_seconds` is `streaming_pacing` with that lead (0.32's
    `normalize_streaming_pacing`)."""
    return StreamingPacing(max_lead_ms=seconds * 1000.0)


@dataclass
class PlayheadLead:
    """One paced session's account of 0.32's rule: media generated, the player's position, and
    the time spent waiting for it. The caller holds its own lock and reads its own clock."""

    pacing: StreamingPacing
    generated_seconds: float = 0.0
    played_seconds: float = 0.0
    wait_seconds: float = 0.0
    #: when the client last made progress (a report that moved the playhead, or a chunk sent)
    progress_at: float | None = None

    def report(self, position_seconds: float, now: float) -> None:
        """A `session.playback` position: reordered or early reports never grant credit for
        media not yet generated, nor move the playhead back (0.32's `update_streaming_playback`)."""
        if not math.isfinite(position_seconds) or position_seconds < 0:
            return
        played = max(self.played_seconds, min(position_seconds, self.generated_seconds))
        if played > self.played_seconds:
            self.progress_at = now
        self.played_seconds = played

    def blocked(self, next_chunk_seconds: float) -> bool:
        """Whether the next chunk must wait for the player: it would put the lead past `max_lead`."""
        lead = self.generated_seconds + next_chunk_seconds - self.played_seconds
        return lead > self.pacing.max_lead_seconds + _EPSILON

    def idle_for(self, now: float, blocked_since: float) -> float:
        """How long a session blocked on its player since `blocked_since` has seen no progress
        from it (0.32's `idle_since`: only client-blocked time counts, a report resets it)."""
        since = blocked_since if self.progress_at is None else max(blocked_since, self.progress_at)
        return max(0.0, now - since)

    def waited(self, seconds: float) -> None:
        if seconds > 0:
            self.wait_seconds += seconds

    def generated(self, media_seconds: float, now: float) -> None:
        self.generated_seconds += media_seconds
        if self.progress_at is None:
            self.progress_at = now

    def metadata(self, retained_bytes: int) -> dict[str, Any]:
        """`pacing` of the chunk just generated (its media counted in `generated_seconds`)."""
        return {
            "lead_seconds": round(self.generated_seconds - self.played_seconds, 6),
            "wait_seconds": round(self.wait_seconds, 6),
            "retained_bytes": retained_bytes,
        }
