"""`interaction_refusal`: the one function that says whether an acked interaction is refused, with
which code and message (pure: a parsed request, a generator's capabilities and the engine's
pipeline rules in, a `Refusal` or None out)."""

from __future__ import annotations

from typing import Any

import pytest

from rtvideo.core.conditioning import INTERPOLATIONS, LINEAR
from rtvideo.core.errors import ErrorCode
from rtvideo.core.interaction.parse import parse_interaction
from rtvideo.core.interaction.refusal import PipelineInteractions, Refusal, interaction_refusal
from rtvideo.core.interaction.support import InteractionSupport
from rtvideo.core.interaction.types import InteractionRequest

#: the built-in generator's and vLLM-Omni's entries, as `rtvideo.backend.catalog` has them
BUILTIN = InteractionSupport(("prompt", "blend", "camera"), ("prompt", "prompts", "multi_modal_data"), INTERPOLATIONS)
ENGINE = InteractionSupport(None, ("prompt", "multi_modal_data"), (LINEAR,))
HELIOS = PipelineInteractions("HeliosPyramidPipeline", frozenset({"prompt"}))
LINGBOT = PipelineInteractions("LingBotWorldCausalDMDPipeline", frozenset({"camera"}))
NO_HANDLERS = PipelineInteractions("WanPipeline", frozenset())
VELOCITY = {"mode": "velocity", "data": {"translation": [0.0, 0.0, 0.05]}}
BLEND = [{"text": "a", "weight": 1}, {"text": "b", "weight": 1}]


def request(event: dict[str, Any], **envelope: Any) -> InteractionRequest:
    return parse_interaction({"interaction": {"event_id": "e", "event": event, **envelope}})


def failed(message: str) -> Refusal:
    return Refusal(ErrorCode.INTERACTION_FAILED, message)


def test_what_a_generator_takes_is_not_refused() -> None:
    for event in ({"prompt": "p"}, {"prompts": BLEND}, {"multi_modal_data": {"camera": VELOCITY}}):
        assert interaction_refusal(request(event, interpolation="slerp"), BUILTIN) is None
    assert interaction_refusal(request({"prompt": "p"}, interpolation="linear"), ENGINE, HELIOS) is None
    assert interaction_refusal(request({"multi_modal_data": {"camera": VELOCITY}}), ENGINE, LINGBOT) is None


def test_an_omni_text_prompt_field_no_model_applies() -> None:
    refused = request({"prompt": "p", "negative_prompt": "n", "cache_salt": "s"})
    expected = failed(
        "event field(s) cache_salt, negative_prompt not supported by the active model; nothing of this event was applied"
    )
    for support in (BUILTIN, ENGINE, None):
        assert interaction_refusal(refused, support) == expected
    # first of all: also with a blend the engine does not take and a modality it has no handler for
    both = request({"prompts": BLEND, "negative_prompt": "n", "multi_modal_data": {"image": {}}})
    assert interaction_refusal(both, ENGINE, HELIOS) == failed(
        "event field(s) negative_prompt not supported by the active model; nothing of this event was applied"
    )


def test_a_field_or_interpolation_the_generator_does_not_take() -> None:
    assert interaction_refusal(request({"prompts": BLEND}), ENGINE, HELIOS) == failed(
        "event field(s) prompts not supported by the active model; nothing of this event was applied"
    )
    assert interaction_refusal(request({"prompt": "p"}, interpolation="slerp"), ENGINE) == failed(
        "interpolation 'slerp' (it takes linear) not supported by the active model; nothing of this event was applied"
    )
    assert interaction_refusal(request({"prompts": BLEND}, interpolation="slerp"), ENGINE) == failed(
        "event field(s) prompts and interpolation 'slerp' (it takes linear) not supported by the active model; "
        "nothing of this event was applied"
    )


@pytest.mark.parametrize(
    "event,pipeline,modality",
    [
        ({"multi_modal_data": {"camera": VELOCITY}}, HELIOS, "camera"),
        ({"prompt": "p", "multi_modal_data": {"camera": VELOCITY}}, HELIOS, "camera"),
        ({"prompt": "p", "multi_modal_data": {"camera": VELOCITY}}, LINGBOT, "prompt"),  # the first, prompt first
        ({"prompt": "p"}, NO_HANDLERS, "prompt"),
        ({"multi_modal_data": {"image": {"url": "x"}, "camera": VELOCITY}}, LINGBOT, "image"),
    ],
)
def test_a_modality_the_engines_pipeline_has_no_handler_for(
    event: dict[str, Any], pipeline: PipelineInteractions, modality: str
) -> None:
    """In vLLM-Omni's coordinator's words: the first kind, in the event's order, it lacks."""
    assert interaction_refusal(request(event), ENGINE, pipeline) == failed(
        f"interaction modality {modality!r} is not supported by pipeline {pipeline.pipeline!r}; "
        "nothing of this event was applied"
    )


def test_a_modality_the_generator_does_not_register() -> None:
    event = {"prompt": "p", "multi_modal_data": {"image": {"url": "x"}, "depth": {}}}
    assert interaction_refusal(request(event), BUILTIN) == failed(
        "interaction modality 'image', 'depth' is not supported by the active model "
        "(it registers blend, camera, prompt); nothing of this event was applied"
    )
    nothing = InteractionSupport((), ("prompt", "multi_modal_data"))
    assert interaction_refusal(request({"prompt": "p"}), nothing) == failed(
        "interaction modality 'prompt' is not supported by the active model (it registers none); "
        "nothing of this event was applied"
    )


def test_unknown_kinds_are_the_engines_to_decide() -> None:
    """No pipeline rules and no kinds (an engine whose pipeline is unknown here): every modality
    is forwarded; the generator's fields and interpolation still apply."""
    assert interaction_refusal(request({"multi_modal_data": {"image": {}}}), ENGINE) is None
    assert interaction_refusal(request({"multi_modal_data": {"image": {}}}), None) is None
    assert interaction_refusal(request({"prompts": BLEND}), ENGINE) is not None


def test_the_pipeline_rules_decide_the_kinds_over_the_generators() -> None:
    """With pipeline rules, the kinds are theirs (and the words the engine's), whatever the
    generator's entry says."""
    camera = request({"multi_modal_data": {"camera": VELOCITY}})
    assert interaction_refusal(camera, BUILTIN, HELIOS) == failed(
        "interaction modality 'camera' is not supported by pipeline 'HeliosPyramidPipeline'; "
        "nothing of this event was applied"
    )
    assert interaction_refusal(camera, InteractionSupport(("prompt",), ("prompt", "multi_modal_data")), LINGBOT) is None
