"""What a chunk is conditioned on, as a recipe over prompt texts (docs/protocol.md §2.2, §5).

Pure: no embeddings here. A generator resolves a recipe against its own embeddings
(`rtvideo.backend.builtin.conditioning.resolve`); the tracker only builds recipes, so it can
run where no text encoder is loaded (the model's process, with render workers).

A `Conditioning` is either
- a `Mix` (`{text: weight}`, weights > 0 summing to 1): the linear combination of the texts'
  embeddings, what every prompt event and linear blend gives (a linear transition between
  two mixes is again a mix, computed exactly here, so a session without slerp sees only mixes);
- an `Interp`: `a` and `b` interpolated at `t` by `method` (`"linear"` or `"slerp"`), where
  either side holds a slerp and so cannot be flattened without the embeddings.

Slerp of more than two prompts is pairwise slerp with cumulative weights over the prompts in
a canonical order (by text), so the result does not depend on the order they were sent in:
((p1 ⊕ p2 at w2/(w1+w2)) ⊕ p3 at w3/(w1+w2+w3)) ⊕ … Exact for two prompts; for more it is
one fixed, documented choice (docs/decisions.md).

Invariant: `Interp` nesting is bounded (`MAX_NESTING`): a transition that would start from a
deeper recipe (a long chain of interrupted slerp transitions) starts from its linear
flattening instead, so a recipe's size, and the cost of resolving it, stay bounded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeAlias

LINEAR = "linear"
SLERP = "slerp"
#: the interpolation methods, in the order a client is told them; the first is the default
INTERPOLATIONS: tuple[str, ...] = (LINEAR, SLERP)
#: the deepest `Interp` nesting a transition starts from (see the module docstring)
MAX_NESTING = 8

Mix = Mapping[str, float]


@dataclass(frozen=True)
class Interp:
    """`a` interpolated towards `b` at `t` in [0, 1] by `method`."""

    method: str
    a: Conditioning
    b: Conditioning
    t: float


#: a string alias (not `X | Y`): `Interp` refers to it before it exists at runtime
Conditioning: TypeAlias = "Mix | Interp"


def normalise(prompts: Sequence[tuple[str, float]]) -> tuple[tuple[str, float], ...]:
    """Weights scaled to sum to 1, in the order given (weights > 0 are the parser's to check)."""
    total = sum(weight for _, weight in prompts)
    return tuple((text, weight / total) for text, weight in prompts)


def blend(prompts: Sequence[tuple[str, float]], method: str = LINEAR) -> Conditioning:
    """The conditioning of a weighted prompt blend. The same text twice counts once, with the
    weights summed; weights are normalised."""
    merged: dict[str, float] = {}
    for text, weight in normalise(prompts):
        merged[text] = merged.get(text, 0.0) + weight
    if method == LINEAR or len(merged) == 1:
        return merged
    _check_method(method)
    ordered = sorted(merged.items())
    out: Conditioning = {ordered[0][0]: 1.0}
    cumulative = ordered[0][1]
    for text, weight in ordered[1:]:
        cumulative += weight
        out = Interp(SLERP, out, {text: 1.0}, weight / cumulative)
    return out


def interpolate(a: Conditioning, b: Conditioning, t: float, method: str = LINEAR) -> Conditioning:
    """`a` towards `b` at `t`: `a` at 0, `b` at 1; two mixes interpolated linearly are one mix
    (zero weights dropped), as the tracker always computed it."""
    _check_method(method)
    if t <= 0.0:
        return a
    if t >= 1.0:
        return b
    if depth(a) >= MAX_NESTING:
        a = flatten(a)
    if method == LINEAR and isinstance(a, Mapping) and isinstance(b, Mapping):
        out = {key: (1.0 - t) * weight for key, weight in a.items()}
        for key, weight in b.items():
            out[key] = out.get(key, 0.0) + t * weight
        return {key: weight for key, weight in out.items() if weight > 0.0}
    return Interp(method, a, b, t)


def depth(c: Conditioning) -> int:
    """How deep `Interp`s nest in `c` (a mix: 0)."""
    if isinstance(c, Interp):
        return 1 + max(depth(c.a), depth(c.b))
    return 0


def flatten(c: Conditioning) -> dict[str, float]:
    """`c` with every interpolation taken linearly: a mix over its texts (exact when `c` holds
    no slerp)."""
    if isinstance(c, Interp):
        a, b = flatten(c.a), flatten(c.b)
        out = {key: (1.0 - c.t) * weight for key, weight in a.items()}
        for key, weight in b.items():
            out[key] = out.get(key, 0.0) + c.t * weight
        return {key: weight for key, weight in out.items() if weight > 0.0}
    return dict(c)


def texts(c: Conditioning) -> set[str]:
    """Every prompt text `c` names."""
    if isinstance(c, Interp):
        return texts(c.a) | texts(c.b)
    return set(c)


def _check_method(method: str) -> None:
    if method not in INTERPOLATIONS:
        raise ValueError(f"interpolation must be one of {', '.join(INTERPOLATIONS)}, not {method!r}")
