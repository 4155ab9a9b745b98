"""The generators this backend can run and what each can produce and use, without importing them.

The settings check runs at model load before any generator is built (and imports no
torch), so each generator's entry lives here, below the generators (`builtin`, `vllm_omni`)
and the loader that assembles them (`loading`), and each generator reads its own entry here.
A vLLM-Omni model's preset and request-frame cap are the engine's facts: `vllm_omni/presets.py`.
"""

from __future__ import annotations

from dataclasses import dataclass

from rtvideo.core.conditioning import INTERPOLATIONS, LINEAR
from rtvideo.core.interaction.support import InteractionSupport
from rtvideo.core.session_config import GeneratorLimits
from rtvideo.core.start_request import SAMPLING_FIELDS


@dataclass(frozen=True)
class AlignedLimits(GeneratorLimits):
    """Limits of a generator whose frame sides must be multiples of `multiple` (a latent grid)."""

    multiple: int = 16

    def size_problem(self, width: int, height: int) -> str | None:
        problem = super().size_problem(width, height)
        if problem is not None and " must be an integer" in problem:
            return problem
        for name, side in (("width", width), ("height", height)):
            if side % self.multiple or not self.min_side <= side <= self.max_side:
                return (
                    f"{name} {side} is not supported: use a multiple of {self.multiple} "
                    f"from {self.min_side} to {self.max_side}"
                )
        return None


#: the built-in renderer: any even size in [32, 1280], up to 60 fps
BUILTIN = GeneratorLimits(min_side=32, max_side=1280, max_fps=60)

#: vLLM-Omni's streaming video models (Helios: 16-pixel latent grid, 640x384 by default)
VLLM_OMNI = AlignedLimits(min_side=128, max_side=1280, max_fps=60, multiple=16)


#: a generator that takes vLLM-Omni's `prompt` and `multi_modal_data`, interpolated linearly
PROMPT_ONLY = InteractionSupport(None, ("prompt", "multi_modal_data"), (LINEAR,))


@dataclass(frozen=True)
class GeneratorEntry:
    """One generator's part of `ModelCapabilities`: what it can produce, and which of a start's
    sampling fields (`start_request.SAMPLING_FIELDS`) and `extra_params` keys it uses. A start may
    set the others; they are reported in `video.start` `config.ignored_fields`."""

    limits: GeneratorLimits
    sampling_fields: frozenset[str] = frozenset()
    extra_params: frozenset[str] = frozenset()
    #: every `extra_params` key is passed on (the engine's model decides what it reads)
    all_extra_params: bool = False
    #: `start_request.REQUEST_FIELDS` it uses (passed on in `config.sampling`); the others are ignored
    start_fields: frozenset[str] = frozenset()
    #: the interactions it takes (`config.interactions`, `GET /v1/models`; docs/protocol.md §2.2)
    interactions: InteractionSupport = PROMPT_ONLY


#: `generator` parameter value → its entry
GENERATORS: dict[str, GeneratorEntry] = {
    # renders from the prompt embedding alone: no diffusion sampling knob applies
    # blends and slerp are rendered from the prompts' embeddings (builtin/conditioning.py)
    "builtin": GeneratorEntry(
        limits=BUILTIN,
        interactions=InteractionSupport(
            ("prompt", "blend", "camera"), ("prompt", "prompts", "multi_modal_data"), INTERPOLATIONS
        ),
    ),
    # as vLLM-Omni's streaming endpoint does: every sampling field and every extra_params key of
    # a start is passed on to the engine, over the model's preset (`vllm_omni/presets.py`)
    "vllm_omni": GeneratorEntry(
        limits=VLLM_OMNI,
        sampling_fields=frozenset(SAMPLING_FIELDS),
        all_extra_params=True,
        # vLLM-Omni's per-request LoRA (`_apply_lora`) and `quality`, which its streaming endpoint
        # sets on the sampling params when a start gives it (`gen_params.quality`: the model's policy)
        start_fields=frozenset({"lora", "quality"}),
        # vLLM-Omni 0.30's engine takes `prompt` (and its pipeline's modalities) and interpolates
        # linearly: a blend or slerp is acked, then `interaction_failed`. Its kinds are its
        # pipeline's (`BackendSettings.interactions`), unknown (None) without a known pipeline
        interactions=PROMPT_ONLY,
    ),
}

#: `generator` parameter value → what it can produce
LIMITS: dict[str, GeneratorLimits] = {name: entry.limits for name, entry in GENERATORS.items()}
