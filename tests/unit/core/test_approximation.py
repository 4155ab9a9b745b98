"""The approximate start of an engine session (rtvideo.core.approximation): the prompt in
effect before chunk N, the first frame, the remaining frames, and a rebuild that only numbers
chunks from N (a branch) or also names the session's own events with those in progress open
(a move); it parses back as the model reads it."""

from __future__ import annotations

from typing import Any

import pytest

from rtvideo.core.approximation import approximate_start, prompt_in_effect
from rtvideo.core.errors import ProtocolError
from rtvideo.core.interaction.parse import parse_interaction
from rtvideo.core.rebuild import ScriptedEvent, parse_rebuild

START: dict[str, Any] = {"type": "session.start", "prompt": "a harbour", "num_frames": 100, "width": 128}


def event(chunk: int, event_id: str, **body: Any) -> ScriptedEvent:
    return ScriptedEvent(chunk, 0, parse_interaction({"interaction": {"event_id": event_id, "event": body}}))


EVENTS = (
    event(2, "p1", prompt="snow"),
    event(4, "cam", multi_modal_data={"camera": {"mode": "velocity", "data": {"translation": [0, 0, 0.1]}}}),
    event(5, "b1", prompts=[{"text": "fog", "weight": 0.5}, {"text": "rain", "weight": 0.5}]),
    event(9, "p2", prompt="dusk"),
)


@pytest.mark.parametrize(
    ("at", "want"),
    [
        (0, {"prompt": "a harbour"}),
        (2, {"prompt": "a harbour"}),  # p1 starts at chunk 2: not yet in effect before it
        (3, {"prompt": "snow"}),  # a transition in progress is taken at its target
        (5, {"prompt": "snow"}),  # a camera event changes no prompt
        (6, {"prompts": [{"text": "fog", "weight": 0.5}, {"text": "rain", "weight": 0.5}]}),
        (10, {"prompt": "dusk"}),
    ],
)
def test_the_prompt_in_effect_is_the_last_started_before_n(at: int, want: dict[str, Any]) -> None:
    assert prompt_in_effect(START, EVENTS, at) == want


def test_a_branch_starts_from_the_frame_with_no_events_and_its_frames_left() -> None:
    start = approximate_start(START, seed=7, at=6, events=EVENTS, image_url="data:x", frames_before=24)
    assert start["prompts"][0]["text"] == "fog" and "prompt" not in start
    assert (start["seed"], start["image_reference"], start["num_frames"], start["width"]) == (7, "data:x", 100, 128)
    rebuild = parse_rebuild(start["rebuild"])
    assert rebuild.generation_chunk_index == 6 and rebuild.events == ()
    assert rebuild.frames_before == 24  # the model plays what is left: 76 frames


def test_a_move_names_its_own_events_and_marks_those_in_progress_open() -> None:
    start = approximate_start(
        START, seed=7, at=6, events=EVENTS, image_url=None, frames_before=24, named=True, open_ids={"cam", "b1"}
    )
    assert "image_reference" not in start  # no frame yet: the start's own (none here)
    rebuild = parse_rebuild(start["rebuild"])
    assert [(e.event_id, e.named, e.open) for e in rebuild.events] == [
        ("p1", True, False),
        ("cam", True, True),
        ("b1", True, True),
    ]  # p2 starts after the cut: not the new stream's to name


def test_open_must_be_a_boolean() -> None:
    bad = {
        "generation_chunk_index": 3,
        "events": [{"chunk": 1, "interaction": {"event_id": "e", "event": {"prompt": "x"}}, "open": 1}],
    }
    with pytest.raises(ProtocolError, match=r"events\[0\]\.open must be a boolean"):
        parse_rebuild(bad)
