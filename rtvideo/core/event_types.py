"""The type of `interaction.event`: vLLM-Omni's `OmniInteractionEvent` when installed.

One definition is used everywhere; the local fallback mirrors the fields of
vLLM-Omni's `OmniTextPrompt` (vLLM `TextPrompt` plus the Omni additions) with
`total=False`, so the validator accepts exactly the keys vLLM-Omni would.
"""

from __future__ import annotations

from typing import Any, TypedDict

try:  # pragma: no cover - exercised only where vllm-omni (CUDA) is installed
    from vllm_omni.diffusion.interaction.types import OmniInteractionEvent
except Exception:  # noqa: BLE001 - any import failure means "not available here"

    class OmniInteractionEvent(TypedDict, total=False):  # type: ignore[no-redef]  # the stand-in where vllm-omni is absent
        prompt: str
        multi_modal_data: dict[str, Any]
        mm_processor_kwargs: dict[str, Any]
        cache_salt: str
        negative_prompt: str
        prompt_embeds: Any
        negative_prompt_embeds: Any
        additional_information: dict[str, Any]


#: Every key `interaction.event` may carry.
EVENT_FIELDS: frozenset[str] = frozenset(
    OmniInteractionEvent.__required_keys__ | OmniInteractionEvent.__optional_keys__
)
#: Keys with a handler today; the others are acked and then fail with `interaction_failed`.
SUPPORTED_EVENT_FIELDS: frozenset[str] = frozenset({"prompt"})
