"""The generators this backend can run and what each can produce, without importing them.

The settings check runs at model load before any generator is built (and imports no
torch), so each generator's `GeneratorLimits` lives here and the generator reads it too.
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
                return (f"{name} {side} is not supported: use a multiple of {self.multiple} "
                        f"from {self.min_side} to {self.max_side}")
        return None


#: the built-in renderer: any even size in [32, 1280], up to 60 fps
BUILTIN = GeneratorLimits(min_side=32, max_side=1280, max_fps=60)

#: vLLM-Omni's streaming video models (Helios: 16-pixel latent grid, 640x384 by default)
VLLM_OMNI = AlignedLimits(min_side=128, max_side=1280, max_fps=60, multiple=16)

#: `generator` parameter value → what it can produce
LIMITS: dict[str, GeneratorLimits] = {"builtin": BUILTIN, "vllm_omni": VLLM_OMNI}
