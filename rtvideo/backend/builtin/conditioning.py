"""A conditioning recipe (`rtvideo.core.conditioning`) resolved against prompt embeddings.

Every recipe resolves to non-negative coefficients over its prompt texts, `{text: c}`, whose
embedding is sum(c * embed(text)): linear interpolation mixes the coefficients; slerp of two
conditionings u, v (norms |u|, |v|, angle θ) is

    ((1-t)|u| + t|v|) * (sin((1-t)θ)/sin θ * u/|u| + sin(tθ)/sin θ * v/|v|)

the great-circle path between their directions, its norm moving linearly between theirs, so
the slerp of equal-norm embeddings keeps that norm (a linear blend of distinct unit embeddings
is shorter). Both coefficients are >= 0, so a resolved recipe is again a non-negative
combination. Near θ = 0 (and at θ = π, where the path is not unique) it falls back to the
linear path of the directions, scaled the same way.

The math is float64: the embeddings are float32, but the norm of a slerp must hold to 1e-5.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import numpy as np

from rtvideo.core.conditioning import LINEAR, Conditioning, Interp

#: below this sin θ, slerp takes the linear path (the two directions are (anti)parallel)
_PARALLEL = 1e-6

Embed = Callable[[str], np.ndarray]


def resolve(c: Conditioning, embed: Embed) -> dict[str, float]:
    """`c` as coefficients over its texts (see the module docstring)."""
    if not isinstance(c, Interp):
        return {text: float(w) for text, w in c.items() if w > 0}
    a, b = resolve(c.a, embed), resolve(c.b, embed)
    t = min(1.0, max(0.0, float(c.t)))
    if c.method == LINEAR:
        ka, kb = 1.0 - t, t
    else:
        ka, kb = slerp_coefficients(vector(a, embed), vector(b, embed), t)
    out = {text: ka * w for text, w in a.items()}
    for text, w in b.items():
        out[text] = out.get(text, 0.0) + kb * w
    return {text: w for text, w in out.items() if w > 0}


def vector(coefficients: Mapping[str, float], embed: Embed) -> np.ndarray:
    """sum(c * embed(text)), float64."""
    out: np.ndarray | None = None
    for text, w in coefficients.items():
        term = w * np.asarray(embed(text), dtype=np.float64)
        out = term if out is None else out + term
    if out is None:
        raise ValueError("a conditioning must name at least one prompt")
    return out


def slerp_coefficients(u: np.ndarray, v: np.ndarray, t: float) -> tuple[float, float]:
    """(ka, kb) with slerp(u, v, t) = ka * u + kb * v (module docstring), both >= 0."""
    nu, nv = float(np.linalg.norm(u)), float(np.linalg.norm(v))
    if nu == 0.0 or nv == 0.0:
        return 1.0 - t, t
    cos = min(1.0, max(-1.0, float(u @ v) / (nu * nv)))
    theta = math.acos(cos)
    sin = math.sin(theta)
    if sin < _PARALLEL:
        da, db = 1.0 - t, t
        # the linear path of two (anti)parallel directions, rescaled to the interpolated norm
        length = abs(da + db * cos) or 1.0
    else:
        da, db = math.sin((1.0 - t) * theta) / sin, math.sin(t * theta) / sin
        length = 1.0
    norm = ((1.0 - t) * nu + t * nv) / length
    return norm * da / nu, norm * db / nv
