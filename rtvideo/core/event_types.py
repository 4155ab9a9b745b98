"""The type of `interaction.event`: vLLM-Omni's `OmniInteractionEvent` when installed.

One definition is used everywhere. In vllm-omni 0.30.0 the type lives in
`vllm_omni.inputs.data` (an `OmniTextPrompt`, i.e. vLLM's `TextPrompt` plus the Omni
additions, with `total=False`); the local fallback, used where vllm-omni is absent, has
exactly its keys, so the validator accepts exactly the keys vLLM-Omni would
(tests/unit/backend/test_vllm_omni_presets.py reads the real class from the pinned
wheel and compares).
"""

from __future__ import annotations

from typing import Any, TypedDict

try:  # pragma: no cover - exercised only where vllm-omni (CUDA) is installed
    from vllm_omni.inputs.data import OmniInteractionEvent
except Exception:  # noqa: BLE001 - any import failure means "not available here"

    class OmniInteractionEvent(TypedDict, total=False):  # type: ignore[no-redef]  # the stand-in where vllm-omni is absent
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
#: Which modalities of `multi_modal_data` apply is the active generator's to say
#: (`rtvideo.backend.runtime.sources.source_modalities`).
SUPPORTED_EVENT_FIELDS: frozenset[str] = frozenset({"prompt", "multi_modal_data"})
