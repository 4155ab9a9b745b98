"""BuiltinGenerator and PromptEncoder: real model, real rendering, no mocks."""

from __future__ import annotations

import itertools
import threading
from typing import Any

import numpy as np
import pytest
import torch

from rtvideo.backend.builtin.generator import (
    BuiltinGenerator,
    GeneratorSession,
    RendererWeights,
    VideoGenerator,
)
from rtvideo.backend.builtin.text_encoder import PromptEncoder

A = "ocean waves at sunset"
B = "a forest of pine trees in fog"
SIZE = dict(width=128, height=96)


@pytest.fixture(scope="module")
def generator() -> BuiltinGenerator:
    return BuiltinGenerator(device="cpu", fps=16)


def distance(x: np.ndarray, y: np.ndarray) -> float:
    """Mean absolute pixel difference on 0..255."""
    return float(np.abs(x.astype(np.int16) - y.astype(np.int16)).mean())


def test_satisfies_the_interfaces(generator: BuiltinGenerator) -> None:
    assert generator.limits.size_problem(SIZE["width"], SIZE["height"]) is None
    generator_api: VideoGenerator = generator
    session: GeneratorSession = generator_api.open_session(seed=1, **SIZE)
    session.close()


def test_embeddings_are_unit_384d_and_cached(generator: BuiltinGenerator) -> None:
    a = generator.embed(A)
    assert a.shape == (384,) and a.dtype == torch.float32
    assert abs(float(a.norm()) - 1) < 1e-4
    a.zero_()  # callers get a copy: the cache must not change
    assert torch.equal(generator.embed(A), generator.embed(A))
    assert float(generator.embed(A).norm()) > 0.99
    assert not torch.allclose(generator.embed(A), generator.embed(B))


def test_text_encoder_cache_is_bounded_lru_and_thread_safe() -> None:
    encoder = PromptEncoder(cache_size=2)
    expected = {p: encoder.encode(p) for p in ("one", "two", "three")}
    assert encoder.cached_prompts() == 2
    results: list[bool] = []

    def worker() -> None:
        for _ in range(5):
            for prompt, value in expected.items():
                results.append(torch.allclose(encoder.encode(prompt), value, atol=1e-6))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results and all(results)
    assert encoder.cached_prompts() == 2


def test_frames_have_the_requested_shape(generator: BuiltinGenerator) -> None:
    for width, height in ((32, 32), (128, 96), (96, 128), (1280, 720)):
        frames = generator.open_session(width=width, height=height, seed=0).generate({A: 1.0}, 2)
        assert frames.shape == (2, height, width, 3) and frames.dtype == np.uint8
        assert frames.flags.c_contiguous


def test_numpy_integers_from_triton_tensors_are_accepted(generator: BuiltinGenerator) -> None:
    session = generator.open_session(width=np.int64(64), height=np.int32(32), seed=np.int64(3))
    assert session.generate({A: 1.0}, 1).shape == (1, 32, 64, 3)


def test_deterministic_for_same_seed_and_mixes(generator: BuiltinGenerator) -> None:
    mixes = [{A: 1.0}, {A: 0.5, B: 0.5}, {B: 1.0}]
    runs = []
    for _ in range(2):
        session = generator.open_session(seed=7, **SIZE)
        runs.append(np.concatenate([session.generate(mix, 3) for mix in mixes]))
    np.testing.assert_array_equal(runs[0], runs[1])
    other_seed = generator.open_session(seed=8, **SIZE).generate({A: 1.0}, 1)[0]
    assert distance(other_seed, runs[0][0]) > 20


def test_weights_come_from_a_fixed_seed(generator: BuiltinGenerator) -> None:
    rebuilt = RendererWeights.from_seed(generator.config, generator.device)
    for name in rebuilt.__dataclass_fields__:
        assert torch.equal(getattr(rebuilt, name), getattr(generator.weights, name)), name


def test_different_prompts_give_clearly_different_frames(generator: BuiltinGenerator) -> None:
    prompts = [A, B, "a red car", "a cat sleeping on a sofa", "neon city at night"]
    frames = [generator.open_session(seed=3, **SIZE).generate({p: 1.0}, 1)[0] for p in prompts]
    for i in range(len(prompts)):
        for j in range(i + 1, len(prompts)):
            assert distance(frames[i], frames[j]) > 20, (prompts[i], prompts[j])
        assert frames[i].std() > 20  # not a flat field


def test_morph_moves_monotonically_towards_the_target(generator: BuiltinGenerator) -> None:
    target = generator.open_session(seed=5, **SIZE).generate({B: 1.0}, 4)
    distances = []
    for weight in (0.0, 0.25, 0.5, 0.75, 1.0):
        frames = generator.open_session(seed=5, **SIZE).generate({A: 1 - weight, B: weight}, 4)
        distances.append(distance(frames, target))
    assert distances[-1] == 0
    assert all(earlier > later + 2 for earlier, later in itertools.pairwise(distances)), distances


def test_motion_is_smooth_and_continues_across_chunks(generator: BuiltinGenerator) -> None:
    session = generator.open_session(seed=11, **SIZE)
    first, second = session.generate({A: 1.0}, 9), session.generate({A: 1.0}, 9)
    steps = [distance(a, b) for a, b in itertools.pairwise(first)]
    assert all(0.2 < step < 8 for step in steps), steps
    boundary = distance(first[-1], second[0])
    assert 0.2 < boundary < 2 * max(steps)
    # Chunking does not matter: one 18-frame call renders the same frames (up to rounding).
    whole = generator.open_session(seed=11, **SIZE).generate({A: 1.0}, 18)
    assert np.abs(whole.astype(int) - np.concatenate([first, second])).max() <= 1


@pytest.mark.parametrize("width, height", [(31, 32), (33, 32), (30, 32), (32, 1282), (64, 63)])
def test_bad_sizes_are_rejected(generator: BuiltinGenerator, width: int, height: int) -> None:
    with pytest.raises(ValueError):
        generator.open_session(width=width, height=height, seed=0)


@pytest.mark.parametrize("mix", [{}, {A: 0.5}, {A: 1.5, B: -0.5}, {A: float("nan")}])
def test_bad_mixes_are_rejected(generator: BuiltinGenerator, mix: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        generator.open_session(seed=0, **SIZE).generate(mix, 1)


def test_closed_session_refuses_to_generate(generator: BuiltinGenerator) -> None:
    session = generator.open_session(seed=0, **SIZE)
    session.close()
    with pytest.raises(RuntimeError):
        session.generate({A: 1.0}, 1)


def test_text_encoder_cache_is_bounded_in_bytes() -> None:
    encoder = PromptEncoder(cache_size=1000, cache_bytes=20_000)
    for i in range(12):
        encoder.encode(f"{i} " + "long prompt text " * 200)  # ~3.4 kB of text + 1.5 kB embedding
    assert encoder.cached_bytes() <= 20_000
    assert 1 <= encoder.cached_prompts() <= 4


class _SlowModel:
    """Embeds at once, except a prompt containing "huge": that one takes until `release`."""

    def __init__(self) -> None:
        self.embedding_huge = threading.Event()
        self.release = threading.Event()

    def encode(self, prompt: str, **_: Any) -> torch.Tensor:
        if "huge" in prompt:
            self.embedding_huge.set()
            assert self.release.wait(30)
        return torch.full((384,), float(len(prompt)))


def test_a_cache_hit_never_waits_for_a_new_embedding() -> None:
    """A neighbour embedding a new prompt must not stall every session's next chunk."""
    model = _SlowModel()
    encoder = PromptEncoder(model=model)
    hit = encoder.encode("a lighthouse")
    neighbour = threading.Thread(target=encoder.encode, args=("a huge new prompt",), daemon=True)
    neighbour.start()
    try:
        assert model.embedding_huge.wait(10)  # the model is busy with the neighbour's prompt now
        done = threading.Event()
        threading.Thread(target=lambda: (encoder.encode("a lighthouse"), done.set()), daemon=True).start()
        assert done.wait(10), "a cached prompt waited for the model"
        assert neighbour.is_alive()  # answered while the model was still busy
    finally:
        model.release.set()
        neighbour.join(10)
    assert torch.equal(encoder.encode("a lighthouse"), hit)
