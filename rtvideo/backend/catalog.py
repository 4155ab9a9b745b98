"""The generators this backend can run and what each can produce and use, without importing them.

The settings check runs at model load before any generator is built (and imports no
torch), so each generator's entry lives here and the generator reads it too.
"""

from __future__ import annotations

from dataclasses import dataclass

from rtvideo.core.session_config import GeneratorLimits


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


@dataclass(frozen=True)
class GeneratorEntry:
    """One generator's part of `ModelCapabilities`: what it can produce, and which of a start's
    sampling fields (`protocol.SAMPLING_FIELDS`) and `extra_params` keys it uses. A start may
    set the others; they are reported in `video.start` `config.ignored_fields`."""

    limits: GeneratorLimits
    sampling_fields: frozenset[str] = frozenset()
    extra_params: frozenset[str] = frozenset()


#: `generator` parameter value → its entry
GENERATORS: dict[str, GeneratorEntry] = {
    # renders from the prompt embedding alone: no diffusion sampling knob applies
    "builtin": GeneratorEntry(limits=BUILTIN),
    # the engine takes its sampling from the model's preset (vllm_omni_extra_params); a start's
    # own sampling fields are not passed on yet, so they are reported as ignored
    "vllm_omni": GeneratorEntry(limits=VLLM_OMNI),
}

#: `generator` parameter value → what it can produce
LIMITS: dict[str, GeneratorLimits] = {name: entry.limits for name, entry in GENERATORS.items()}
