"""Textures and the small numeric helpers the layout draws with."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class TextureBank:
    """Global texture components (same in every session): a slow, prompt-coloured mottling.

    Component m is sin(k_m . p + phase_m + omega_m t); its RGB coefficient is linear in the
    prompt embedding (`projection`), so it tells prompts apart that the vocabulary does not.
    """

    vectors: np.ndarray  # [M, 2] spatial frequencies (radians per unit)
    omegas: np.ndarray  # [M] radians per second
    amplitudes: np.ndarray  # [M]

    @classmethod
    def from_seed(cls, seed: int, count: int = 12) -> TextureBank:
        rng = np.random.default_rng([seed, 1])
        angles = rng.uniform(0, 2 * np.pi, count)
        radii = np.exp(rng.uniform(np.log(2.5), np.log(8.0), count))
        vectors = np.stack([np.cos(angles), np.sin(angles)], axis=1) * radii[:, None]
        omegas = rng.uniform(0.4, 1.0, count) * rng.choice([-1.0, 1.0], count)
        amplitudes = radii**-0.5
        return cls(vectors=vectors, omegas=omegas, amplitudes=amplitudes / np.sqrt((amplitudes**2).sum() / 2))

    @property
    def count(self) -> int:
        return len(self.omegas)


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1 + np.tanh(0.5 * x))


def sine_pairs(X: np.ndarray, Y: np.ndarray, k: np.ndarray, phase: np.ndarray) -> np.ndarray:
    """[2M, P] float32: sin and cos of k_m . (x, y) + phase_m on the grid, interleaved (sin_0, cos_0, ...)."""
    out = np.empty((2 * len(k), X.size), dtype=np.float32)
    for m in range(len(k)):
        psi = (np.float32(k[m, 0]) * X + np.float32(k[m, 1]) * Y + np.float32(phase[m])).reshape(-1)
        np.sin(psi, out=out[2 * m])
        np.cos(psi, out=out[2 * m + 1])
    return out


def smooth_ramp(lo: float, hi: float, x: np.ndarray) -> np.ndarray:
    u = np.clip((x - lo) / (hi - lo), 0, 1)
    return u * u * (3 - 2 * u)
