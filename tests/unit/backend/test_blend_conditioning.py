"""The built-in generator's blends: the conditioning against oracles computed here from the
real MiniLM embeddings, and rendered frames that hold both scenes of a 50/50 blend."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rtvideo.backend.builtin.generator import BuiltinGenerator
from rtvideo.core import conditioning
from rtvideo.core.conditioning import Interp

A, B = "a red lighthouse at sunset", "a snowy forest at night"
MORE = ("a neon city street in the rain", "a calm blue ocean at noon", "a campfire in a dark cave")
SIZE = dict(width=128, height=96)


@pytest.fixture(scope="module")
def generator() -> BuiltinGenerator:
    return BuiltinGenerator(device="cpu", fps=16)


def unit(generator: BuiltinGenerator, text: str) -> np.ndarray:
    return generator.embed(text).double().numpy()


def test_a_linear_blend_is_the_weighted_sum(generator: BuiltinGenerator) -> None:
    prompts = [(A, 2.0), (B, 1.0), (MORE[0], 1.0)]
    expected = sum(w / 4.0 * unit(generator, text) for text, w in prompts)
    got = generator.blend(conditioning.blend(prompts, "linear")).double().numpy()
    np.testing.assert_allclose(got, expected, atol=1e-6)
    assert np.linalg.norm(got) < 0.95  # distinct unit embeddings: a linear blend is shorter


@pytest.mark.parametrize("count", [2, 3, 5])
def test_slerp_keeps_the_norm_and_linear_does_not(generator: BuiltinGenerator, count: int) -> None:
    texts = (A, B, *MORE)[:count]
    weights = [1.0 + i for i in range(count)]
    norms = [np.linalg.norm(unit(generator, t)) for t in texts]
    assert max(norms) - min(norms) < 1e-5  # equal-norm inputs (MiniLM is normalised)
    prompts = list(zip(texts, weights, strict=True))
    slerped = generator.blend(conditioning.blend(prompts, "slerp")).double().numpy()
    linear = generator.blend(conditioning.blend(prompts, "linear")).double().numpy()
    assert abs(np.linalg.norm(slerped) - norms[0]) < 1e-5
    assert np.linalg.norm(linear) < norms[0] - 0.02


@pytest.mark.parametrize("t", [0.5, 0.3])
def test_slerp_of_two_is_the_closed_form(generator: BuiltinGenerator, t: float) -> None:
    a, b = unit(generator, A), unit(generator, B)
    theta = math.acos(float(a @ b))
    expected = (math.sin((1 - t) * theta) * a + math.sin(t * theta) * b) / math.sin(theta)
    if t == 0.5:  # the midpoint of the arc: the normalised sum
        np.testing.assert_allclose(expected, (a + b) / np.linalg.norm(a + b), atol=1e-12)
    recipe = conditioning.blend([(A, 1 - t), (B, t)], "slerp")
    np.testing.assert_allclose(generator.blend(recipe).double().numpy(), expected, atol=1e-6)


def test_a_slerp_transition_stays_on_the_sphere(generator: BuiltinGenerator) -> None:
    for alpha in (0.25, 0.5, 0.75):
        mid = generator.blend(Interp("slerp", {A: 1.0}, {B: 1.0}, alpha)).double().numpy()
        lin = generator.blend(conditioning.interpolate({A: 1.0}, {B: 1.0}, alpha)).double().numpy()
        assert abs(np.linalg.norm(mid) - 1.0) < 1e-5 and np.linalg.norm(lin) < 0.99


def test_linear_scene_parameters_are_unchanged_by_the_recipe_path(generator: BuiltinGenerator) -> None:
    mix = {A: 0.5, B: 0.5}
    as_recipe = Interp("linear", {A: 1.0}, {B: 1.0}, 0.5)
    torch.testing.assert_close(generator.scene_parameters(as_recipe), generator.scene_parameters(mix))


def mean_abs(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.abs(x.astype(np.float64) - y.astype(np.float64)).mean())


@pytest.mark.parametrize("method", ["linear", "slerp"])
@pytest.mark.parametrize("seed", [0, 3])
def test_a_50_50_blend_shows_both_scenes(generator: BuiltinGenerator, method: str, seed: int) -> None:
    """Per pixel, the blend frame lies between the two scenes: near neither, closer to each than
    they are to each other, and between them where they differ most."""

    def frames(mix: conditioning.Conditioning) -> np.ndarray:
        return generator.open_session(seed=seed, **SIZE).generate(mix, 3)

    fa, fb = frames({A: 1.0}), frames({B: 1.0})
    both = frames(conditioning.blend([(A, 1.0), (B, 1.0)], method))
    apart = mean_abs(fa, fb)
    assert apart > 20  # two visibly different scenes
    to_a, to_b = mean_abs(both, fa), mean_abs(both, fb)
    assert 0.25 * apart < to_a < 0.75 * apart and 0.25 * apart < to_b < 0.75 * apart
    # where the scenes differ most, the blend is strictly between them in most pixels
    lo, hi = np.minimum(fa, fb).astype(np.int16), np.maximum(fa, fb).astype(np.int16)
    far = (hi - lo) > 60
    between = (both.astype(np.int16) > lo + 10) & (both.astype(np.int16) < hi - 10)
    assert far.sum() > 1000 and between[far].mean() > 0.8
