"""`video.chunk_metadata` for media and trailer payloads (docs/protocol.md §5–6)."""

from __future__ import annotations

from typing import Any

from rtvideo.core.protocol import CHUNK_METADATA
from rtvideo.core.transitions import ChunkPlan

MEDIA = "media"
TRAILER = "trailer"
#: the initialisation payload (ftyp+moov) of a resumed connection or a watcher (docs/protocol.md §9)
INIT = "init"
#: `{event_id: frame}` of a media chunk: where in the chunk each event started in it took effect,
#: for those after frame 0 (docs/protocol.md §6); what an exact rebuild replays
EVENT_FRAME_OFFSETS = "event_frame_offsets"
#: vLLM-Omni 0.32's `coalesced_event_ids`: pending targets superseded before they started,
#: reported at the boundary where they would have started: `superseded_event_ids` under 0.32's
#: name, on media chunks only and only when not empty (docs/protocol.md §5)
COALESCED_EVENT_IDS = "coalesced_event_ids"


def _metadata(
    request_id: str,
    kind: str,
    transport_chunk_index: int,
    generation_chunk_index: int | None,
    num_frames: int,
    byte_length: int,
    plan: ChunkPlan | None,
) -> dict[str, Any]:
    """The one shape of `video.chunk_metadata`; without a plan every event list is empty."""
    return {
        "type": CHUNK_METADATA,
        "request_id": request_id,
        "kind": kind,
        "transport_chunk_index": transport_chunk_index,
        "generation_chunk_index": generation_chunk_index,
        "num_frames": num_frames,
        "byte_length": byte_length,
        "started_event_ids": list(plan.started) if plan else [],
        "active_event_ids": list(plan.active) if plan else [],
        "completed_event_ids": list(plan.completed) if plan else [],
        "superseded_event_ids": list(plan.superseded) if plan else [],
        "interrupted_event_ids": list(plan.interrupted) if plan else [],
        "transition_progress": dict(plan.progress) if plan else {},
    }


def media_metadata(
    request_id: str, transport_chunk_index: int, plan: ChunkPlan, num_frames: int, byte_length: int
) -> dict[str, Any]:
    """Metadata for the payload of one generation chunk, with the tracker's id lists, and
    `event_frame_offsets` when an event started after the chunk's first frame (absent otherwise)."""
    meta = _metadata(
        request_id, MEDIA, transport_chunk_index, plan.generation_chunk_index, num_frames, byte_length, plan
    )
    if plan.frame_offsets:
        meta[EVENT_FRAME_OFFSETS] = dict(plan.frame_offsets)
    if plan.superseded:  # vLLM-Omni 0.32's name for them, present only when not empty as there
        meta[COALESCED_EVENT_IDS] = list(plan.superseded)
    return meta


def trailer_metadata(request_id: str, transport_chunk_index: int, byte_length: int) -> dict[str, Any]:
    """Metadata for the encoder's closing bytes: no generation chunk, no frames, no events."""
    return _metadata(request_id, TRAILER, transport_chunk_index, None, 0, byte_length, None)


def init_metadata(request_id: str, byte_length: int) -> dict[str, Any]:
    """Metadata of an init pair: no transport index of its own (null), no frames, no events. Sent
    only after a resume or to a watcher, so that a fresh decoder or MSE buffer can start there."""
    return {**_metadata(request_id, INIT, 0, None, 0, byte_length, None), "transport_chunk_index": None}


def mentioned_event_ids(metadata: dict[str, Any]) -> set[str]:
    """Every event id a metadata message names (the ack-before-mention rule checks these)."""
    keys = (
        "started_event_ids",
        "active_event_ids",
        "completed_event_ids",
        "superseded_event_ids",
        "interrupted_event_ids",
        COALESCED_EVENT_IDS,
    )
    return {event_id for key in keys for event_id in metadata.get(key, ())}


def realtime_factor(frames: int, fps: float, generate_seconds: float, encode_seconds: float) -> float | None:
    """A chunk's media seconds (frames / fps) per wall second spent making it (generation and
    encoding, no pacing wait); below 1 the model cannot keep up with real-time playback. None
    when nothing was made or no time was measured (a clock too coarse for the chunk is no
    evidence of infinite speed)."""
    spent = generate_seconds + encode_seconds
    if frames <= 0 or fps <= 0 or spent <= 0:
        return None
    return (frames / fps) / spent


def chunk_timing(frames: int, fps: float, generate_seconds: float, encode_seconds: float) -> dict[str, Any]:
    """The `timing` of a media chunk's metadata, for a start that asked for `metrics`
    (docs/protocol.md §6): seconds rounded to 0.1 ms, the factor to 3 decimals (null: unmeasured)."""
    factor = realtime_factor(frames, fps, generate_seconds, encode_seconds)
    return {
        "generate_seconds": round(generate_seconds, 4),
        "encode_seconds": round(encode_seconds, 4),
        "realtime_factor": None if factor is None else round(factor, 3),
    }
