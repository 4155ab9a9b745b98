"""Chunk metadata for media and trailer payloads."""

from rtvideo.core.chunks import media_metadata, mentioned_event_ids, trailer_metadata
from rtvideo.core.transitions import TransitionTracker


def test_media_and_trailer() -> None:
    tracker = TransitionTracker("p0")
    tracker.admit("a", "p1", 2)
    tracker.admit("b", "p2", 2)
    plan = tracker.next_chunk()
    meta = media_metadata("rid", 5, plan, 9, 1234)
    assert meta["type"] == "video.chunk_metadata" and meta["kind"] == "media"
    assert (meta["transport_chunk_index"], meta["generation_chunk_index"]) == (5, 0)
    assert (meta["num_frames"], meta["byte_length"]) == (9, 1234)
    assert meta["started_event_ids"] == ["b"] and meta["superseded_event_ids"] == ["a"]
    assert meta["coalesced_event_ids"] == ["a"]  # vLLM-Omni 0.32's name, present when not empty
    assert meta["transition_progress"] == {"b": 0.5}
    assert mentioned_event_ids(meta) == {"a", "b"}
    trailer = trailer_metadata("rid", 6, 40)
    assert trailer["kind"] == "trailer" and trailer["generation_chunk_index"] is None
    assert trailer["num_frames"] == 0 and trailer["transition_progress"] == {}
    assert set(trailer) == set(meta) - {"coalesced_event_ids"}
    assert "coalesced_event_ids" not in media_metadata("rid", 7, tracker.next_chunk(), 9, 10)
    assert mentioned_event_ids(trailer) == set()
