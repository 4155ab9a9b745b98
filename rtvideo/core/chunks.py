"""`video.chunk_metadata` for media and trailer payloads (docs/protocol.md §5–6)."""

from __future__ import annotations

from typing import Any

from rtvideo.core.protocol import CHUNK_METADATA
from rtvideo.core.transitions import ChunkPlan

MEDIA = "media"
TRAILER = "trailer"
#: the initialisation payload (ftyp+moov) of a resumed connection or a watcher (docs/protocol.md §9)
INIT = "init"


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
    """Metadata for the payload of one generation chunk, with the tracker's id lists."""
    return _metadata(
        request_id, MEDIA, transport_chunk_index, plan.generation_chunk_index, num_frames, byte_length, plan
    )


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
    )
    return {event_id for key in keys for event_id in metadata.get(key, ())}
