"""The one parser of `session.interaction` (docs/protocol.md §2.2): a message in, an
`InteractionRequest` with its typed parts out. Pure; failures are `ProtocolError`s with code
`invalid_interaction` (and the event id when the client sent one), and record nothing.

The proxy (its acks), the model (`protocol.parse_message`, over the proxy's stream or direct
gRPC) and every source read what this returns, never the raw event.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from rtvideo.core import camera
from rtvideo.core.conditioning import INTERPOLATIONS, normalise
from rtvideo.core.errors import ErrorCode, ProtocolError
from rtvideo.core.event_types import BLEND_EVENT_FIELDS, EVENT_FIELDS, OmniInteractionEvent
from rtvideo.core.fields import (
    MAX_EVENT_ID_CHARS,
    MAX_TRANSITION_CHUNKS,
    as_int,
    json_kind,
    require_interpolation,
    require_prompt,
    require_prompts,
)
from rtvideo.core.interaction.types import (
    CAMERA,
    BlendPart,
    CameraPart,
    InteractionRequest,
    ModalityPart,
    Part,
    PromptPart,
)

_BAD = ErrorCode.INVALID_INTERACTION
_ENVELOPE = frozenset({"event_id", "event", "transition_chunks", "interpolation"})


def parse_interaction(obj: Mapping[str, Any]) -> InteractionRequest:
    """A `session.interaction` message (decoded JSON) as a typed request."""
    interaction = obj.get("interaction")
    if not isinstance(interaction, dict):
        raise ProtocolError(_BAD, f"interaction must be an object, not {json_kind(interaction)}")
    event_id = _event_id(interaction.get("event_id"))
    try:
        unknown_keys = sorted(set(interaction) - _ENVELOPE)
        if unknown_keys:
            raise ProtocolError(_BAD, f"unknown interaction field(s): {', '.join(unknown_keys)}")
        event = interaction.get("event")
        if not isinstance(event, dict):
            raise ProtocolError(_BAD, f"interaction.event must be an object, not {json_kind(event)}")
        unknown = sorted(set(event) - EVENT_FIELDS - BLEND_EVENT_FIELDS)
        if unknown:
            raise ProtocolError(_BAD, f"unknown event field(s): {', '.join(unknown)}")
        event, parts = _event_parts(event)
        chunks = interaction.get("transition_chunks")
        if chunks is not None:
            chunks = as_int(chunks, "transition_chunks", 0, MAX_TRANSITION_CHUNKS, _BAD)
        interpolation = interaction.get("interpolation")
        if interpolation is not None:
            interpolation = require_interpolation(interpolation, "interpolation", _BAD, INTERPOLATIONS)
    except ProtocolError as exc:  # every failure after the id names it
        raise ProtocolError(exc.code, exc.message, event_id) from None
    return InteractionRequest(cast(OmniInteractionEvent, dict(event)), event_id, chunks, interpolation, parts)


def _event_id(event_id: Any) -> str | None:
    if event_id is None:
        return None
    if not isinstance(event_id, str) or not event_id:
        raise ProtocolError(_BAD, "event_id must be a non-empty string")
    if len(event_id) > MAX_EVENT_ID_CHARS:
        raise ProtocolError(_BAD, f"event_id is longer than {MAX_EVENT_ID_CHARS} characters")
    return event_id


def _scene_part(event: dict[str, Any]) -> Part | None:
    """The event's `prompt` or `prompts` (a blend, in the prompt's place: never both), or None."""
    if event.get("prompts") is not None:
        if event.get("prompt") is not None:
            raise ProtocolError(_BAD, "an event carries prompt or prompts, not both")
        return BlendPart(normalise(require_prompts(event["prompts"], "event.prompts", _BAD)))
    if event.get("prompt") is not None:
        return PromptPart(require_prompt(event["prompt"], "event.prompt", _BAD))
    return None


def _event_parts(event: dict[str, Any]) -> tuple[dict[str, Any], tuple[Part, ...]]:
    """An event's `prompt` (or `prompts`) and/or `multi_modal_data` (vLLM-Omni 0.30's rule,
    docs/protocol.md §2.2): at least one; a `null` one is absent (and dropped, as vLLM-Omni's
    server drops it); each modality an object; `camera` valid (`rtvideo.core.camera`). Returns
    the event as it is kept (and forwarded) and its parts, the prompt (or blend) first."""
    mm = event.get("multi_modal_data")
    if mm is None:
        if "prompt" not in event and event.get("prompts") is None:
            raise ProtocolError(
                _BAD, "an event needs a prompt and/or multi_modal_data: interaction.event.prompt is required"
            )
        if event.get("prompts") is None:  # a prompt event: checked by the prompt rules alone
            prompt = require_prompt(event["prompt"], "event.prompt", _BAD)
            kept = {k: v for k, v in event.items() if k not in ("multi_modal_data", "prompts")}
            return kept, (PromptPart(prompt),)
        scene = _scene_part(event)
        assert scene is not None
        kept = {k: v for k, v in event.items() if k not in ("multi_modal_data", "prompt")}
        return kept, (scene,)
    if not isinstance(mm, dict):
        raise ProtocolError(_BAD, f"event.multi_modal_data must be an object, not {json_kind(mm)}")
    if not mm:
        raise ProtocolError(_BAD, "event.multi_modal_data must be a non-empty object when provided")
    modalities: list[Part] = []
    for modality, payload in mm.items():
        if not isinstance(payload, dict):
            raise ProtocolError(_BAD, f"event.multi_modal_data[{modality[:40]!r}] must be an object")
        modalities.append(ModalityPart(modality, payload))
    for i, part in enumerate(modalities):
        if part.kind == CAMERA:
            assert isinstance(part, ModalityPart)
            try:
                modalities[i] = CameraPart(camera.parse_camera(part.payload))
            except camera.CameraError as exc:
                raise ProtocolError(_BAD, f"event.multi_modal_data.camera: {exc}") from None
    scene = _scene_part(event)
    kept = {k: v for k, v in event.items() if event.get(k) is not None or k not in ("prompt", "prompts")}
    return kept, ((scene, *modalities) if scene is not None else tuple(modalities))
