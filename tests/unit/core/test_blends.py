"""Weighted prompt blends (`event.prompts`, `session.start` `prompts`) and `interpolation`:
parsing, identity, the prompt's slot in the tracker, and what each generator takes."""

from __future__ import annotations

from typing import Any

import pytest

from rtvideo.core import conditioning
from rtvideo.core.conditioning import Interp
from rtvideo.core.errors import ErrorCode, ProtocolError
from rtvideo.core.interaction.parse import parse_interaction
from rtvideo.core.interaction.refusal import interaction_refusal
from rtvideo.core.interaction.support import InteractionSupport
from rtvideo.core.interaction.types import BLEND, BlendPart, Interaction
from rtvideo.core.session_config import ModelCapabilities, resolve_session_config
from rtvideo.core.start_request import validate_start
from rtvideo.core.transitions import TransitionTracker

TWO = [{"text": "a harbour", "weight": 3}, {"text": "a forest", "weight": 1}]
BUILTIN = InteractionSupport(
    ("prompt", "blend", "camera"), ("prompt", "prompts", "multi_modal_data"), ("linear", "slerp")
)
ENGINE = InteractionSupport(None, ("prompt", "multi_modal_data"), ("linear",))


def message(event: Any, **envelope: Any) -> dict[str, Any]:
    return {"type": "session.interaction", "interaction": {"event_id": "b1", "event": event, **envelope}}


def test_a_blend_is_one_blend_part_with_normalised_weights() -> None:
    request = parse_interaction(message({"prompts": TWO}, interpolation="slerp", transition_chunks=2))
    assert request.kinds == (BLEND,) and request.parts == (BlendPart((("a harbour", 0.75), ("a forest", 0.25))),)
    assert request.blend == (("a harbour", 0.75), ("a forest", 0.25)) and request.prompt is None
    assert request.interpolation == "slerp" and request.transition_chunks == 2
    assert request.event == {"prompts": TWO}  # kept (and fingerprinted) as sent


def test_a_blend_may_ride_with_a_camera_and_a_null_prompt_is_absent() -> None:
    camera = {"camera": {"mode": "velocity", "data": {"translation": [0, 0, 0.1]}}}
    request = parse_interaction(message({"prompts": TWO, "prompt": None, "multi_modal_data": camera}))
    assert request.kinds == (BLEND, "camera") and "prompt" not in request.event


@pytest.mark.parametrize(
    "event,envelope,text",
    [
        ({"prompts": TWO[:1]}, {}, "event.prompts must hold 2 to 8 prompts, not 1"),
        ({"prompts": TWO * 4 + TWO[:1]}, {}, "event.prompts must hold 2 to 8 prompts, not 9"),
        ({"prompts": [TWO[0], {"text": "x", "weight": 0}]}, {}, "event.prompts[1].weight must be greater than 0"),
        ({"prompts": [TWO[0], {"text": "x", "weight": -1}]}, {}, "event.prompts[1].weight must be greater than 0"),
        (
            {"prompts": [TWO[0], {"text": "x", "weight": "1"}]},
            {},
            "event.prompts[1].weight must be a number, not a string",
        ),
        (
            {"prompts": [TWO[0], {"text": "x", "weight": True}]},
            {},
            "event.prompts[1].weight must be a number, not a boolean",
        ),
        ({"prompts": [TWO[0], {"text": " ", "weight": 1}]}, {}, "event.prompts[1].text must not be empty"),
        ({"prompts": [TWO[0], {"text": "x"}]}, {}, "event.prompts[1] needs both text and weight"),
        ({"prompts": [TWO[0], {"text": "x", "weight": 1, "w": 2}]}, {}, "event.prompts[1] has unknown field(s): w"),
        ({"prompts": "ab"}, {}, "event.prompts must be an array of {text, weight} objects, not a string"),
        ({"prompts": TWO, "prompt": "x"}, {}, "an event carries prompt or prompts, not both"),
        ({"prompt": "x"}, {"interpolation": "cubic"}, "interpolation must be 'linear' or 'slerp', not 'cubic'"),
        ({"prompt": "x"}, {"interpolation": 1}, "interpolation must be 'linear' or 'slerp', not a number"),
    ],
)
def test_invalid_blends_are_refused_before_the_ack(event: Any, envelope: dict[str, Any], text: str) -> None:
    with pytest.raises(ProtocolError) as info:
        parse_interaction(message(event, **envelope))
    assert info.value.code is ErrorCode.INVALID_INTERACTION
    assert info.value.message.startswith(text) and info.value.event_id == "b1"


def test_the_fingerprint_covers_interpolation() -> None:
    plain = parse_interaction(message({"prompts": TWO}))
    linear = parse_interaction(message({"prompts": TWO}, interpolation="linear"))
    slerp = parse_interaction(message({"prompts": TWO}, interpolation="slerp"))
    assert len({plain.fingerprint, linear.fingerprint, slerp.fingerprint}) == 3
    assert slerp.fingerprint == parse_interaction(message({"prompts": TWO}, interpolation="slerp")).fingerprint
    # a request without interpolation keeps the identity it always had
    assert (
        parse_interaction(message({"prompt": "x"})).fingerprint
        == parse_interaction(message({"prompt": "x"}, interpolation=None)).fingerprint
    )


def admitted(event: Any, default: str = "linear", **envelope: Any) -> Interaction:
    request = parse_interaction(message(event, **envelope))
    return Interaction.admitted(request, "b1", prompt_default=3, received_at=0.0, interpolation_default=default)


def test_a_blend_takes_the_prompts_n_and_the_sessions_interpolation() -> None:
    interaction = admitted({"prompts": TWO}, default="slerp")
    assert interaction.chunks == {BLEND: 3} and interaction.prompt_chunks == 3 and interaction.interpolation == "slerp"
    assert admitted({"prompts": TWO}, "slerp", interpolation="linear").interpolation == "linear"


def test_a_blend_and_a_prompt_supersede_each_other() -> None:
    tracker = TransitionTracker("start")
    tracker.admit("p1", "fog", 0)
    tracker.admit("b1", conditioning.blend([("a", 1), ("b", 1)]), 0)  # supersedes the pending prompt
    plan = tracker.next_chunk()
    assert plan.superseded == ("p1",) and plan.completed == ("b1",) and plan.mix == {"a": 0.5, "b": 0.5}
    tracker.admit("b2", conditioning.blend([("c", 1), ("d", 3)]), 0)
    tracker.admit("p2", "rain", 0)  # and a prompt supersedes a pending blend
    plan = tracker.next_chunk()
    assert plan.superseded == ("b2",) and plan.started == plan.active == plan.completed == ("p2",)
    assert plan.mix == {"rain": 1.0}


def test_a_linear_blend_transition_is_a_mix_from_the_state_at_the_boundary() -> None:
    tracker = TransitionTracker("s")
    tracker.admit("b1", conditioning.blend([("a", 1), ("b", 3)]), 2)
    first = tracker.next_chunk()
    assert first.mix == pytest.approx({"s": 0.5, "a": 0.125, "b": 0.375})
    assert first.started == first.active == ("b1",) and first.progress == {"b1": 0.5}
    second = tracker.next_chunk()
    assert second.mix == pytest.approx({"a": 0.25, "b": 0.75}) and second.completed == ("b1",)


def test_a_slerp_transition_is_a_recipe_from_the_state_at_the_boundary() -> None:
    tracker = TransitionTracker("s")
    tracker.admit("p1", "x", 3)  # linear, interrupted at 1/3 by a slerp blend
    tracker.next_chunk()
    target = conditioning.blend([("a", 1), ("b", 1)], "slerp")
    tracker.admit("b1", target, 2, "slerp")
    plan = tracker.next_chunk()
    assert plan.interrupted == ("p1",) and plan.started == ("b1",)
    assert plan.mix == Interp("slerp", {"s": pytest.approx(1 / 3), "x": pytest.approx(2 / 3)}, target, 0.5)
    assert tracker.next_chunk().mix == target


def test_slerp_blends_are_pairwise_in_a_canonical_order() -> None:
    three = [("c", 1.0), ("a", 2.0), ("b", 1.0)]
    recipe = conditioning.blend(three, "slerp")
    assert recipe == Interp("slerp", Interp("slerp", {"a": 1.0}, {"b": 1.0}, 1 / 3), {"c": 1.0}, 0.25)
    assert conditioning.blend(list(reversed(three)), "slerp") == recipe  # order sent does not matter
    assert conditioning.blend(three) == {"c": 0.25, "a": 0.5, "b": 0.25}


def test_recipe_nesting_is_bounded() -> None:
    state: conditioning.Conditioning = {"s": 1.0}
    for i in range(50):  # a chain of interrupted slerp transitions
        state = conditioning.interpolate(state, {f"p{i}": 1.0}, 0.5, "slerp")
        assert conditioning.depth(state) <= conditioning.MAX_NESTING + 1


def test_what_each_generator_takes() -> None:
    blend = parse_interaction(message({"prompts": TWO}))
    slerp = parse_interaction(message({"prompt": "x"}, interpolation="slerp"))
    assert interaction_refusal(blend, BUILTIN) is None and interaction_refusal(slerp, BUILTIN) is None
    refused_blend, refused_slerp = interaction_refusal(blend, ENGINE), interaction_refusal(slerp, ENGINE)
    assert refused_blend is not None and "event field(s) prompts not supported" in refused_blend.message
    assert (
        refused_slerp is not None and "interpolation 'slerp' (it takes linear) not supported" in refused_slerp.message
    )
    assert ENGINE.describe() == {
        "kinds": None,
        "event_fields": ["prompt", "multi_modal_data"],
        "interpolation": ["linear"],
    }


def caps(support: InteractionSupport) -> ModelCapabilities:
    return ModelCapabilities(("m",), 64, 64, 16, 9, 3, interactions=support)


def test_a_start_with_prompts() -> None:
    start = validate_start({"type": "session.start", "prompts": TWO, "interpolation": "slerp", "seed": 1})
    assert start.prompts == (("a harbour", 0.75), ("a forest", 0.25)) and start.prompt == "a harbour"
    config = resolve_session_config(start, caps(BUILTIN)).to_json()
    assert config["prompts"] == [{"text": "a harbour", "weight": 0.75}, {"text": "a forest", "weight": 0.25}]
    assert config["interpolation"] == "slerp" and config["interactions"]["kinds"] == ["prompt", "blend", "camera"]
    plain = resolve_session_config(validate_start({"type": "session.start", "prompt": "p"}), caps(ENGINE)).to_json()
    assert "prompts" not in plain and plain["interpolation"] == "linear"


@pytest.mark.parametrize(
    "start,text",
    [
        ({"prompts": TWO, "prompt": "x"}, "session.start carries prompt or prompts, not both"),
        ({"prompts": TWO[:1]}, "prompts must hold 2 to 8 prompts, not 1"),
        ({"prompt": "x", "interpolation": "nearest"}, "interpolation must be 'linear' or 'slerp'"),
        ({}, "session.start needs a prompt"),
    ],
)
def test_invalid_blend_starts(start: dict[str, Any], text: str) -> None:
    with pytest.raises(ProtocolError) as info:
        validate_start({"type": "session.start", **start})
    assert info.value.code is ErrorCode.INVALID_START and info.value.message.startswith(text)


@pytest.mark.parametrize(
    "start,field", [({"prompts": TWO}, "prompts"), ({"prompt": "x", "interpolation": "slerp"}, "interpolation")]
)
def test_a_generator_without_blends_refuses_them_at_the_start(start: dict[str, Any], field: str) -> None:
    with pytest.raises(ProtocolError) as info:
        resolve_session_config(validate_start({"type": "session.start", **start}), caps(ENGINE))
    assert info.value.code is ErrorCode.INVALID_START and info.value.message.startswith(field)
