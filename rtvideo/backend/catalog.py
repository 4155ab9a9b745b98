"""The generators this backend can run and what each can produce, without importing them.

The settings check runs at model load before any generator is built (and imports no
torch), so each generator's `GeneratorLimits` lives here and the generator reads it too.
"""

from __future__ import annotations

from rtvideo.core.session_config import GeneratorLimits

#: the built-in renderer: any even size in [32, 1280], up to 60 fps
BUILTIN = GeneratorLimits(min_side=32, max_side=1280, max_fps=60)

#: `generator` parameter value → what it can produce
LIMITS: dict[str, GeneratorLimits] = {"builtin": BUILTIN}
