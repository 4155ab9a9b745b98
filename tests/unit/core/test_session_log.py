"""The rebuild plan of a recording's event log (rtvideo/core/session_log.py) and the model's
`rebuild` field (rtvideo/core/rebuild.py), on hand-written logs."""

from __future__ import annotations

import json
from typing import Any

import pytest

from rtvideo.core.errors import ProtocolError
from rtvideo.core.rebuild import check_rebuild, parse_rebuild, split_start
from rtvideo.core.session_log import SessionLogError, parse_lines, read_log


def inbound(message: dict[str, Any], t: float = 0.0) -> dict[str, Any]:
    return {"t": t, "dir": "in", "participant": "owner", "message": message}


def out(message: dict[str, Any], t: float = 0.0) -> dict[str, Any]:
    return {"t": t, "dir": "out", "message": message}


def interaction(event: dict[str, Any], event_id: str | None = None, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"event": event, **extra}
    if event_id is not None:
        body["event_id"] = event_id
    return {"type": "session.interaction", "interaction": body}


def chunk(index: int, started: list[str] = (), offsets: dict[str, int] | None = None, **lists: Any) -> dict:  # type: ignore[assignment]
    meta = {
        "type": "video.chunk_metadata",
        "request_id": "r",
        "kind": "media",
        "transport_chunk_index": index,
        "generation_chunk_index": index,
        "num_frames": 9,
        "byte_length": 10,
        "started_event_ids": list(started),
        "active_event_ids": list(started),
        "completed_event_ids": [],
        "superseded_event_ids": lists.get("superseded", []),
        "interrupted_event_ids": [],
        "transition_progress": {},
    }
    if offsets:
        meta["event_frame_offsets"] = offsets
    return out(meta)


def acked(event_id: str) -> dict[str, Any]:
    return out({"type": "session.interaction.queued", "request_id": "r", "event_id": event_id})


CONFIG = {"prompt": "a harbour", "width": 64, "height": 64, "fps": 16, "frames_per_chunk": 9, "seed": 1234}
CAMERA = {"multi_modal_data": {"camera": {"mode": "target", "data": {"translation": [1, 0, 0]}}}}


def basic_log() -> list[dict[str, Any]]:
    return [
        inbound({"type": "session.start", "prompt": "a harbour", "record": True, "steerable": True}),
        out({"type": "video.start", "request_id": "r", "format": "m4s", "config": CONFIG}),
        chunk(0),
        inbound(interaction({"prompt": "old"}, "p0")),
        acked("p0"),
        inbound(interaction({"prompt": "snow"}, "p1", transition_chunks=2)),
        acked("p1"),
        chunk(1, ["p1"], superseded=["p0"]),
        inbound(interaction(CAMERA, "c1")),
        acked("c1"),
        chunk(2, ["c1"], {"c1": 4}),
        inbound(interaction({"prompt": "never"}, "late")),
        acked("late"),
    ]


def test_started_events_with_their_chunk_and_frame_and_the_seed_pinned() -> None:
    log = read_log(basic_log())
    assert [(e.event_id, e.chunk, e.frame_offset) for e in log.events] == [("p1", 1, 0), ("c1", 2, 4)]
    assert log.events[0].request.transition_chunks == 2 and log.events[0].request.event == {"prompt": "snow"}
    assert log.chunks == 3 and log.frames == 27 and log.seed == 1234 and log.built_in()
    # the proxy's own fields are dropped, the seed is the one the model ran with
    assert log.start_message() == {"type": "session.start", "prompt": "a harbour", "seed": 1234}
    assert [e.event_id for e in log.rebuild(1).events] == ["p1"]
    assert log.rebuild(2).to_json()["events"][1] == {
        "chunk": 2,
        "frame_offset": 4,
        "interaction": {"event_id": "c1", "event": CAMERA},
    }


def test_parse_lines_round_trip_and_malformed_lines() -> None:
    text = "\n".join(json.dumps(line) for line in basic_log()) + "\n\n"
    assert read_log(parse_lines(text)).events == read_log(basic_log()).events
    with pytest.raises(SessionLogError, match="line 1"):
        parse_lines("{nope")


def test_the_acked_payload_wins_over_a_conflicting_or_refused_one() -> None:
    lines = [
        *basic_log()[:3],
        inbound(interaction({"prompt": "limited"}, "e")),
        out({"type": "error", "code": "rate_limited", "message": "m", "request_id": "r", "event_id": "e"}),
        inbound(interaction({"prompt": "applied"}, "e")),
        acked("e"),
        inbound(interaction({"prompt": "conflict"}, "e")),
        out({"type": "error", "code": "event_id_conflict", "message": "m", "request_id": "r", "event_id": "e"}),
        inbound(interaction({"prompt": "applied"}, "e")),  # a retry: acked again
        acked("e"),
        chunk(1, ["e"]),
    ]
    (event,) = read_log(lines).events
    assert event.request.event == {"prompt": "applied"}


def test_an_interaction_without_an_id_takes_the_server_generated_one() -> None:
    lines = [
        *basic_log()[:3],
        inbound(interaction({"prompt": "anonymous"})),
        inbound({"type": "session.interaction", "interaction": {"event": {}}}),  # invalid: refused, no ack
        acked("8d1f-generated"),
        chunk(1, ["8d1f-generated"]),
    ]
    (event,) = read_log(lines).events
    assert event.event_id == "8d1f-generated" and event.request.event == {"prompt": "anonymous"}


def test_a_repeated_chunk_is_the_same_chunk_and_an_unknown_started_id_is_an_error() -> None:
    lines = basic_log()
    log = read_log([*lines, chunk(2, ["c1"], {"c1": 4})])
    assert log.chunks == 3
    with pytest.raises(SessionLogError, match="ghost"):
        read_log([*lines, chunk(3, ["ghost"])])
    with pytest.raises(SessionLogError, match=r"session\.start"):
        read_log(lines[1:])
    with pytest.raises(SessionLogError, match=r"video\.start"):
        read_log([lines[0]])


def test_another_generator_is_recognised_by_its_sampling() -> None:
    lines = basic_log()
    lines[1] = out({"type": "video.start", "config": {**CONFIG, "sampling": {"num_inference_steps": 4}}})
    assert not read_log(lines).built_in()


def test_rebuild_field_parses_and_is_checked() -> None:
    log = read_log(basic_log())
    fields, rebuild = split_start({"type": "session.start", "prompt": "p", "rebuild": log.rebuild(2).to_json()})
    assert "rebuild" not in fields and rebuild == log.rebuild(2)
    assert split_start({"type": "session.start", "prompt": "p"})[1] is None
    check_rebuild(rebuild, frames_per_chunk=9, num_frames=None)
    bad = [
        ([], "must be an object"),
        ({"events": []}, "generation_chunk_index"),
        ({"generation_chunk_index": -1}, "between"),
        ({"generation_chunk_index": 1, "extra": 1}, "unknown rebuild"),
        ({"generation_chunk_index": 1, "events": [{"chunk": 2, "interaction": {}}]}, r"events\[0\].chunk"),
        (
            {"generation_chunk_index": 1, "events": [{"chunk": 0, "interaction": {"event": {"prompt": "x"}}}]},
            "event_id",
        ),
        (
            {"generation_chunk_index": 1, "events": [{"chunk": 0, "interaction": {"event_id": "a", "event": {}}}]},
            "interaction",
        ),
    ]
    for value, match in bad:
        with pytest.raises(ProtocolError, match=match) as caught:
            parse_rebuild(value)
        assert caught.value.code.value == "invalid_start"
    with pytest.raises(ProtocolError, match="frame_offset 4"):
        check_rebuild(rebuild, frames_per_chunk=4, num_frames=None)
    with pytest.raises(ProtocolError, match="past the session"):
        check_rebuild(rebuild, frames_per_chunk=9, num_frames=18)
