"""The frames a session would have had undisturbed (no move, no takeover): the session
re-generated in this process from its log (rtvideo.backend.replay.regenerate), encoded by one
encoder that is never replaced, and decoded; and how close a stream's frames came to them."""

from __future__ import annotations

from typing import Any

import numpy as np

from rtvideo.backend import catalog
from rtvideo.backend.builtin.generator import BuiltinGenerator
from rtvideo.backend.media.encoder import FragmentedMp4Encoder
from rtvideo.backend.replay.regenerate import replay_frames
from rtvideo.core.session_log import read_log
from tests.support.streams import decode

FPS = 16


def regenerate(lines: list[dict[str, Any]], generator: BuiltinGenerator, width: int, height: int) -> np.ndarray:
    """The decoded frames of the session whose log is `lines` (`{"dir", "message"}` each: what its
    clients sent, and what they received: its events take effect where the acks and chunks say)."""
    encoder = FragmentedMp4Encoder(width, height, FPS, catalog.LIMITS["builtin"])
    replayed = replay_frames(read_log(lines), generator)
    return decode(b"".join([encoder.encode_chunk(r.frames) for r in replayed] + [encoder.close()]))


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


def worst_psnr(got: np.ndarray, want: np.ndarray) -> float:
    """The lowest PSNR of a frame against its counterpart (the two must have as many frames)."""
    return min(psnr(g, w) for g, w in zip(got, want, strict=True))
