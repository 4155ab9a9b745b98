"""Image motion measured between two frames, for the camera tests (unit and browser)."""

from __future__ import annotations

import numpy as np


def gray(rgb: np.ndarray) -> np.ndarray:
    return rgb.astype(np.float64) @ np.array([0.299, 0.587, 0.114])


def shift(before: np.ndarray, after: np.ndarray) -> tuple[float, float]:
    """(dy, dx) in pixels that moves `before`'s content to where it is in `after` (phase correlation,
    Hann-windowed, with a parabolic sub-pixel peak)."""
    a, b = gray(before), gray(after)
    window = np.outer(np.hanning(a.shape[0]), np.hanning(a.shape[1]))
    fa, fb = np.fft.fft2((a - a.mean()) * window), np.fft.fft2((b - b.mean()) * window)
    # band-pass: the lowest frequencies hold what does not move with the camera (the lens's vignette)
    ky, kx = np.meshgrid(
        np.fft.fftfreq(a.shape[0]) * a.shape[0], np.fft.fftfreq(a.shape[1]) * a.shape[1], indexing="ij"
    )
    cross = fb * np.conj(fa) * (np.hypot(ky, kx) >= 3)
    surface = np.real(np.fft.ifft2(cross / (np.abs(cross) + 1e-9)))
    peak = np.unravel_index(np.argmax(surface), surface.shape)
    out = []
    for axis, size in enumerate(surface.shape):
        index = list(peak)
        values = []
        for step in (-1, 0, 1):
            index[axis] = (peak[axis] + step) % size
            values.append(surface[tuple(index)])
        lo, mid, hi = values
        denom = lo - 2 * mid + hi
        offset = 0.5 * (lo - hi) / denom if denom else 0.0
        value = peak[axis] + offset
        out.append(value - size if value > size / 2 else value)
    return out[0], out[1]
