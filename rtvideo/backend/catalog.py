"""The generators this backend can run and what each can produce and use, without importing them.

The settings check runs at model load before any generator is built (and imports no
torch), so each generator's entry lives here and the generator reads it too.
"""

from __future__ import annotations

from dataclasses import dataclass

from rtvideo.core.session_config import GeneratorLimits

#: the built-in renderer: any even size in [32, 1280], up to 60 fps
BUILTIN = GeneratorLimits(min_side=32, max_side=1280, max_fps=60)


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
}

#: `generator` parameter value → what it can produce
LIMITS: dict[str, GeneratorLimits] = {name: entry.limits for name, entry in GENERATORS.items()}
