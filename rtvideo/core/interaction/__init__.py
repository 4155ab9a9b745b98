"""Interactions parsed once into typed parts (`types`), by one parser (`parse`), refused or not
by one function (`refusal`), applied by per-kind handlers (`registry`). Pure: the proxy, the
model and direct gRPC share it."""

from rtvideo.core.interaction.parse import parse_interaction
from rtvideo.core.interaction.refusal import PipelineInteractions, Refusal, interaction_refusal
from rtvideo.core.interaction.registry import Handler, HandlerRegistry, UnhandledKinds
from rtvideo.core.interaction.types import (
    BLEND,
    CAMERA,
    PROMPT,
    BlendPart,
    CameraPart,
    Interaction,
    InteractionRequest,
    ModalityPart,
    Part,
    PromptPart,
    resolve_chunks,
)

__all__ = [
    "BLEND",
    "CAMERA",
    "PROMPT",
    "BlendPart",
    "CameraPart",
    "Handler",
    "HandlerRegistry",
    "Interaction",
    "InteractionRequest",
    "ModalityPart",
    "Part",
    "PipelineInteractions",
    "PromptPart",
    "Refusal",
    "UnhandledKinds",
    "interaction_refusal",
    "parse_interaction",
    "resolve_chunks",
]
