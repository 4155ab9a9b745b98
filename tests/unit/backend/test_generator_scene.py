"""The built-in generator draws what the prompt says: measurable colour, light and transitions.

Real MiniLM embeddings and real rendering: the scene's light, ground and elements come from
the prompt's similarity to the concept vocabulary (rtvideo/backend/builtin/scene/concepts.py).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from rtvideo.backend.builtin.generator import BuiltinGenerator

SIZE = dict(width=128, height=96)
SEEDS = (0, 1, 2)


@pytest.fixture(scope="module")
def generator() -> BuiltinGenerator:
    return BuiltinGenerator(device="cpu", fps=16)


def frames_of(generator: BuiltinGenerator, prompt: str, seed: int, count: int = 3) -> np.ndarray:
    return generator.open_session(seed=seed, **SIZE).generate({prompt: 1.0}, count)


def hsv(frames: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Hue (radians, red = 0), saturation and value of uint8 RGB pixels."""
    rgb = frames.reshape(-1, 3).astype(np.float64) / 255
    r, g, b = rgb.T
    top, low = rgb.max(axis=1), rgb.min(axis=1)
    spread = np.where(top > low, top - low, 1.0)
    hue = np.where(top == r, (g - b) / spread, np.where(top == g, 2 + (b - r) / spread, 4 + (r - g) / spread))
    saturation = np.where(top > 0, (top - low) / np.maximum(top, 1e-9), 0.0)
    return hue * (np.pi / 3), saturation, top


def mean_hue(frames: np.ndarray) -> float:
    """The circular mean hue, weighted by how coloured each pixel is."""
    hue, saturation, value = hsv(frames)
    weight = saturation * value
    return float(np.arctan2((weight * np.sin(hue)).sum(), (weight * np.cos(hue)).sum()))


def redness(frames: np.ndarray) -> float:
    """Angular distance of the mean hue from pure red (0 = red, pi = cyan)."""
    return abs(mean_hue(frames))


def luminance(frames: np.ndarray) -> float:
    return float((frames.astype(np.float64) @ np.array([0.2126, 0.7152, 0.0722])).mean())


def distance(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.abs(x.astype(np.int16) - y.astype(np.int16)).mean())


def test_the_vocabulary_reads_the_prompt(generator: BuiltinGenerator) -> None:
    cases = {
        "a red lighthouse at sunset": ("sunset", "water", {"beacon"}),
        "a deep blue ocean": ("day", "water", set()),
        "a snowy forest at night": ("night", "snow", {"trees"}),
        "a busy city street at noon": ("day", "street", {"buildings"}),
        "a cat sleeping on a sofa": ("indoor", "floor", {"creature"}),
        "a red fire": (None, None, {"fire"}),
    }
    for prompt, (light, ground, elements) in cases.items():
        seen = generator.scene_weights(prompt).dominant()
        assert light is None or seen["light"] == light, (prompt, seen)
        assert ground is None or seen["ground"] == ground, (prompt, seen)
        assert elements <= set(seen["elements"]), (prompt, seen)
    red, blue = generator.scene_weights("a red fire"), generator.scene_weights("a deep blue ocean")
    assert red.accent_strength > 0.5 and red.accent[0] > 2 * red.accent[2]
    assert blue.accent_strength > 0.5 and blue.accent[2] > 2 * blue.accent[0]


@pytest.mark.parametrize("seed", SEEDS)
def test_a_red_fire_is_redder_than_a_deep_blue_ocean(generator: BuiltinGenerator, seed: int) -> None:
    fire, ocean = frames_of(generator, "a red fire", seed), frames_of(generator, "a deep blue ocean", seed)
    assert redness(fire) < np.pi / 6, mean_hue(fire)  # red to orange
    assert redness(ocean) > 0.5 * np.pi, mean_hue(ocean)  # cyan to blue
    r, b = (frames.reshape(-1, 3).mean(axis=0) for frames in (fire, ocean))
    assert r[0] > r[2] + 30 and b[2] > b[0] + 30, (r, b)
    # The sunset lighthouse of the README is warm too.
    sunset = frames_of(generator, "a red lighthouse at sunset", seed).reshape(-1, 3).mean(axis=0)
    assert sunset[0] > sunset[2] + 30, sunset


@pytest.mark.parametrize("seed", SEEDS)
def test_night_is_darker_than_noon(generator: BuiltinGenerator, seed: int) -> None:
    night, noon = luminance(frames_of(generator, "night", seed)), luminance(frames_of(generator, "noon", seed))
    assert night < 0.4 * noon, (night, noon)
    snowy_night, snow = (luminance(frames_of(generator, p, seed)) for p in ("a snowy forest at night", "snow"))
    assert snowy_night < snow


@pytest.mark.parametrize("seed", SEEDS)
def test_snow_is_brighter_and_paler_than_forest(generator: BuiltinGenerator, seed: int) -> None:
    snow, forest = frames_of(generator, "snow", seed), frames_of(generator, "forest", seed)
    assert luminance(snow) > luminance(forest) + 30
    assert hsv(snow)[1].mean() < 0.7 * hsv(forest)[1].mean()


def test_scene_parameters_mix_exactly(generator: BuiltinGenerator) -> None:
    a, b = "a red lighthouse at sunset", "a snowy forest at night"
    pa, pb = generator.prompt_parameters(a), generator.prompt_parameters(b)
    for weight in (0.0, 0.3, 0.5, 1.0):
        mixed = generator.scene_parameters({a: 1 - weight, b: weight})
        torch.testing.assert_close(mixed, (1 - weight) * pa + weight * pb, rtol=0, atol=1e-6)
    assert not torch.allclose(pa, pb)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_transition_moves_chunk_by_chunk_toward_the_target(generator: BuiltinGenerator, seed: int) -> None:
    """As the runtime does it: one session, the mix advancing 1/N per chunk (N = 4)."""
    a, b = "a red lighthouse at sunset", "a snowy forest at night"
    morph, source, target = (generator.open_session(seed=seed, **SIZE) for _ in range(3))
    chunks = []
    for step in range(6):
        alpha = min(1.0, step / 4)  # chunk 0: A; then 1/4, 1/2, 3/4, 1 (the runtime's N = 4); then B
        mix = {a: 1 - alpha, b: alpha} if 0 < alpha < 1 else {b if alpha else a: 1.0}
        chunks.append((morph.generate(mix, 9), source.generate({a: 1.0}, 9), target.generate({b: 1.0}, 9)))
    to_target = [distance(m, t) for m, _, t in chunks]
    from_source = [distance(m, s) for m, s, _ in chunks]
    assert to_target[0] > 25, to_target  # the two scenes are clearly different
    assert all(x > y + 2 for x, y in itertools.pairwise(to_target[:5])), to_target
    assert to_target[4] == 0 and to_target[5] == 0, to_target
    assert from_source[0] == 0 and all(x < y - 2 for x, y in itertools.pairwise(from_source[:5])), from_source
    # Every pixel moves one way only: between its two ends (up to rounding), never beyond.


@pytest.mark.parametrize("seed", SEEDS)
def test_every_pixel_moves_one_way_during_a_transition(generator: BuiltinGenerator, seed: int) -> None:
    """At a size rendered without upsampling, each pixel of a mix lies between its two ends."""
    a, b, size = "a red lighthouse at sunset", "a snowy forest at night", dict(width=64, height=48)
    assert generator.config.render_size(**size) == (48, 64)
    ends = [generator.open_session(seed=seed, **size).generate({p: 1.0}, 4).astype(np.int16) for p in (a, b)]
    low, high = np.minimum(*ends), np.maximum(*ends)
    previous = ends[0]
    for alpha in (0.2, 0.4, 0.6, 0.8, 1.0):
        frames = generator.open_session(seed=seed, **size).generate({a: 1 - alpha, b: alpha}, 4).astype(np.int16)
        assert (frames >= low).all() and (frames <= high).all()
        # ... and keeps going the same way: never back toward A.
        assert (np.abs(frames - ends[1]) <= np.abs(previous - ends[1]) + 1).all()
        previous = frames


def test_the_update_shows_within_its_first_chunk(generator: BuiltinGenerator) -> None:
    """A hard switch (N = 0) changes the picture at once: the next frame is the new scene."""
    session = generator.open_session(seed=4, **SIZE)
    before = session.generate({"a deep blue ocean": 1.0}, 9)
    after = session.generate({"a red fire": 1.0}, 9)
    assert distance(before[-1], after[0]) > 25
    assert redness(after) < redness(before)
