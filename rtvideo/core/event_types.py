"""The type of `interaction.event`: vLLM-Omni's `OmniInteractionEvent`, keys and all.

One definition is used everywhere. In vllm-omni 0.30.0 the type lives in
`vllm_omni.inputs.data` (an `OmniTextPrompt`, i.e. vLLM's `TextPrompt` plus the Omni
additions, with `total=False`); this module's copy has exactly its keys, so the validator
accepts exactly the keys vLLM-Omni would (tests/unit/backend/test_vllm_omni_presets.py reads
the real class from the pinned wheel and compares). The copy is used even where vLLM-Omni is
installed: importing it imports vLLM and torch, which the pure core, the proxy and the
client must not pay for (nor fail on, as inside a stub whose text encoding is ASCII).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:  # the module that defines the real type
    from vllm_omni.inputs.data import OmniInteractionEvent as _Real  # noqa: F401


class OmniInteractionEvent(TypedDict, total=False):
    # vLLM's TextPrompt (vllm/inputs: `prompt` and its `_PromptOptions`)
    prompt: str
    multi_modal_data: dict[str, Any] | None
    mm_processor_kwargs: dict[str, Any] | None
    multi_modal_uuids: dict[str, Any]
    cache_salt: str
    # vLLM-Omni's OmniTextPrompt (vllm_omni/inputs/data.py)
    negative_prompt: str
    modalities: list[str]
    prompt_embeds: Any
    negative_prompt_embeds: Any
    additional_information: dict[str, Any]
    model_intermediate_buffer: dict[str, Any]


#: Every key `interaction.event` may carry.
EVENT_FIELDS: frozenset[str] = frozenset(
    OmniInteractionEvent.__required_keys__ | OmniInteractionEvent.__optional_keys__
)
#: Keys with a handler today; the others are acked and then fail with `interaction_failed`.
#: Which modalities of `multi_modal_data` apply is the active model's to say
#: (`rtvideo.core.interaction.refusal.interaction_refusal` decides).
SUPPORTED_EVENT_FIELDS: frozenset[str] = frozenset({"prompt", "multi_modal_data"})
#: Our additions to `interaction.event` (docs/protocol.md §2.2): `prompts`, a weighted blend in
#: place of `prompt`. Kept apart from `EVENT_FIELDS` (which is exactly vLLM-Omni's type); which
#: generator applies it is its `InteractionSupport`'s to say.
BLEND_EVENT_FIELDS: frozenset[str] = frozenset({"prompts"})
