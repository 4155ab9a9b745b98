"""Whether the active model refuses an acked interaction, and with which error: one pure function,
`interaction_refusal`, the only place that decides it (docs/protocol.md §2.2).

The model calls it at admission (`rtvideo.backend.runtime.admission.EventDesk`), before any
source or engine sees the event, for every client alike: the proxy relays the model's answer and
a direct gRPC client reads the same one. A refused event is acked, then answered with this error
on the session's stream; nothing of it is applied.

What it decides from is data: the request as parsed (`parse.parse_interaction`), what the
generator takes (`InteractionSupport`, sent as `config.interactions`) and, for a hosted engine,
its model's own rules about interactions (`PipelineInteractions`, built by the backend from the
vLLM-Omni model rule table, `rtvideo/backend/vllm_omni/model_rules.py`, which
tests/unit/backend/test_vllm_omni_refusals.py reads against the pinned wheel's registry and
coordinator). What it cannot know (a payload the engine's handler rejects, a prompt it cannot
encode) is the engine's to refuse, later.
"""

from __future__ import annotations

from dataclasses import dataclass

from rtvideo.core.errors import ErrorCode
from rtvideo.core.event_types import BLEND_EVENT_FIELDS, SUPPORTED_EVENT_FIELDS
from rtvideo.core.interaction.support import InteractionSupport
from rtvideo.core.interaction.types import InteractionRequest

#: how every refusal ends: an event is applied whole or not at all
NOTHING_APPLIED = "nothing of this event was applied"


@dataclass(frozen=True)
class PipelineInteractions:
    """A hosted engine's model's own rule about interactions: the modalities its pipeline class
    has a handler for (vLLM-Omni's `STRUCTURED_HANDLER_REGISTRY`; none for a class it does not
    list). A modality outside them is refused in the engine's own words, naming the class."""

    pipeline: str
    modalities: frozenset[str]


@dataclass(frozen=True)
class Refusal:
    """The error an acked interaction gets instead of being applied."""

    code: ErrorCode
    message: str


def interaction_refusal(
    request: InteractionRequest,
    support: InteractionSupport | None,
    pipeline: PipelineInteractions | None = None,
) -> Refusal | None:
    """Why the active model applies nothing of `request`, or None when it takes all of it.

    In this order (the first that applies is the answer):
    1. an `OmniTextPrompt` field no model applies (only `prompt`, `multi_modal_data` and our
       `prompts` have handlers anywhere);
    2. a field, or an interpolation, the generator does not take (`support`: a blend or slerp on
       vLLM-Omni);
    3. a kind the model does not apply: with `pipeline` (a hosted engine), the first one its
       pipeline class has no handler for, as vLLM-Omni's coordinator names it; else every kind
       outside `support.kinds` (None: unknown, nothing is checked).
    """
    unhandled = sorted(set(request.event) - SUPPORTED_EVENT_FIELDS - BLEND_EVENT_FIELDS)
    if unhandled:
        return _failed(f"event field(s) {', '.join(unhandled)} not supported by the active model")
    if support is not None:
        fields = sorted(set(request.event) - set(support.event_fields))
        why = [f"event field(s) {', '.join(fields)}"] if fields else []
        if request.interpolation is not None and request.interpolation not in support.interpolation:
            why.append(f"interpolation {request.interpolation!r} (it takes {', '.join(support.interpolation)})")
        if why:
            return _failed(f"{' and '.join(why)} not supported by the active model")
    if pipeline is not None:
        for kind in request.kinds:
            if kind not in pipeline.modalities:
                # `InteractionCoordinator.get_handler`'s words (vllm_omni/diffusion/interaction/coordinator.py)
                return _failed(f"interaction modality {kind!r} is not supported by pipeline {pipeline.pipeline!r}")
        return None
    if support is not None and support.kinds is not None:
        missing = [kind for kind in request.kinds if kind not in support.kinds]
        if missing:
            return _failed(
                f"interaction modality {', '.join(map(repr, missing))} is not supported by the active model "
                f"(it registers {', '.join(sorted(support.kinds)) or 'none'})"
            )
    return None


def _failed(why: str) -> Refusal:
    return Refusal(ErrorCode.INTERACTION_FAILED, f"{why}; {NOTHING_APPLIED}")
