"""Interactions parsed once into typed parts (`rtvideo.core.interaction`): the parser, each
part's N resolved in one place, and the per-kind handler registry."""

from __future__ import annotations

from typing import Any

import pytest

from rtvideo.core import camera
from rtvideo.core.errors import ErrorCode, ProtocolError
from rtvideo.core.interaction.parse import parse_interaction
from rtvideo.core.interaction.registry import HandlerRegistry, UnhandledKinds
from rtvideo.core.interaction.types import (
    BLEND,
    CAMERA,
    PROMPT,
    CameraPart,
    Interaction,
    InteractionRequest,
    ModalityPart,
    Part,
    PromptPart,
    resolve_chunks,
)

VELOCITY = {"mode": "velocity", "data": {"translation": [0.1, 0, 0]}}


def message(event: Any, **envelope: Any) -> dict[str, Any]:
    return {"type": "session.interaction", "interaction": {"event_id": "e1", "event": event, **envelope}}


def test_a_prompt_event_is_one_prompt_part() -> None:
    request = parse_interaction(message({"prompt": "fog"}))
    assert request.parts == (PromptPart("fog"),) and request.kinds == (PROMPT,)
    assert request.prompt == "fog" and request.camera is None and request.transition_chunks is None


def test_parts_follow_vllm_omni_order_prompt_first() -> None:
    event = {"multi_modal_data": {"camera": VELOCITY, "image": {"url": "x"}}, "prompt": "rain"}
    request = parse_interaction(message(event, transition_chunks=2))
    assert request.kinds == (PROMPT, CAMERA, "image")
    assert request.parts[1] == CameraPart(camera.parse_camera(VELOCITY))
    assert request.parts[2] == ModalityPart("image", {"url": "x"})
    assert request.camera is not None and request.camera.mode is camera.CameraMode.VELOCITY


def test_each_kind_resolves_its_own_default_n() -> None:
    both = parse_interaction(message({"prompt": "rain", "multi_modal_data": {"camera": VELOCITY}}))
    admitted = Interaction.admitted(both, "e1", prompt_default=4, received_at=1.5)
    assert admitted.chunks == {PROMPT: 4, CAMERA: camera.DEFAULT_TRANSITION_CHUNKS}
    assert admitted.transition_chunks is None and admitted.received_at == 1.5  # as sent, for an engine
    sent = parse_interaction(message({"prompt": "rain", "multi_modal_data": {"camera": VELOCITY}}, transition_chunks=0))
    assert Interaction.admitted(sent, "e1", prompt_default=4, received_at=0.0).chunks == {PROMPT: 0, CAMERA: 0}
    assert resolve_chunks("image", None, 4) == 1 and resolve_chunks(BLEND, None, 4) == 4


def test_parts_are_not_part_of_the_identity() -> None:
    parsed = parse_interaction(message({"multi_modal_data": {"camera": VELOCITY}}))
    built = InteractionRequest(event={"multi_modal_data": {"camera": VELOCITY}}, event_id="e1")
    assert built == parsed and built.parts == parsed.parts and built.fingerprint == parsed.fingerprint
    filled = InteractionRequest(event={"prompt": "x"}).with_event_id()
    assert filled.event_id and filled.parts == (PromptPart("x"),)


@pytest.mark.parametrize(
    "interaction,text,event_id",
    [
        ({"event_id": ""}, "event_id must be a non-empty string", None),
        ({"event_id": "e", "event": {"prompt": "x"}, "extra": 1}, "unknown interaction field(s): extra", "e"),
        ({"event_id": "e", "event": []}, "interaction.event must be an object, not an array", "e"),
        ({"event_id": "e", "event": {"prompt": " "}}, "event.prompt must not be empty", "e"),
        (
            {"event_id": "e", "event": {"prompt": "x"}, "transition_chunks": 2.5},
            "transition_chunks must be an integer, not 2.5",
            "e",
        ),
        (
            {"event_id": "e", "event": {"multi_modal_data": {"camera": {"mode": "spin", "data": {}}}}},
            "event.multi_modal_data.camera: camera mode must be 'target' or 'velocity'",
            "e",
        ),
    ],
)
def test_refusals_keep_their_words_and_name_the_event(interaction: Any, text: str, event_id: str | None) -> None:
    with pytest.raises(ProtocolError) as info:
        parse_interaction({"type": "session.interaction", "interaction": interaction})
    assert (info.value.code, info.value.message, info.value.event_id) == (
        ErrorCode.INVALID_INTERACTION,
        text,
        event_id,
    )


def test_the_registry_applies_every_part_in_order_or_none() -> None:
    seen: list[tuple[str, str, int]] = []

    def handler(interaction: Interaction, part: Part) -> None:
        seen.append((interaction.event_id, part.kind, interaction.chunks[part.kind]))

    registry = HandlerRegistry({CAMERA: handler, PROMPT: handler})
    both = parse_interaction(message({"prompt": "rain", "multi_modal_data": {"camera": VELOCITY}}))
    registry.admit(Interaction.admitted(both, "e1", prompt_default=3, received_at=0.0))
    assert seen == [("e1", PROMPT, 3), ("e1", CAMERA, 1)]
    other = parse_interaction(message({"prompt": "rain", "multi_modal_data": {"image": {}}}))
    with pytest.raises(UnhandledKinds) as info:
        registry.admit(Interaction.admitted(other, "e2", prompt_default=3, received_at=0.0))
    assert info.value.kinds == ["image"] and len(seen) == 2  # nothing of it applied
