"""A branch or a move of a vLLM-Omni session plays what is left of its length, whether its start
gave `num_frames` or `seconds` (rtvideo.core.approximation carries the frames shown before the
cut; the model takes them off the length it resolves at its own fps: `Starts._rebuilt`)."""

from __future__ import annotations

from typing import Any

import pytest

from rtvideo.backend.runtime.starts import Starts
from rtvideo.backend.settings import BackendSettings
from rtvideo.core.approximation import approximate_start
from rtvideo.core.rebuild import split_start
from rtvideo.core.session_config import resolve_session_config
from rtvideo.core.start_request import validate_start


class _Approximating:
    approximates = True  # as `EngineSources`


@pytest.mark.parametrize(
    ("length", "left"),
    [({"num_frames": 100}, 76), ({"seconds": 5}, 56), ({"seconds": 1}, 1), ({}, 1452)],
)
def test_a_branch_or_move_plays_what_is_left_of_its_length(length: dict[str, Any], left: int) -> None:
    """At 16 fps 5 s are 80 frames: 24 were shown, 56 are left (1 s, shorter than what was shown:
    one frame). An open-ended start gets its new engine request's whole cap (1452 at 640x384)."""
    given = {"type": "session.start", "prompt": "a harbour", **length}
    start = approximate_start(given, seed=7, at=6, events=(), image_url=None, frames_before=24)
    fields, rebuild = split_start(start)
    caps = BackendSettings(generator="vllm_omni", width=640, height=384).capabilities("m")
    config = resolve_session_config(validate_start(fields), caps)
    starts = Starts.__new__(Starts)  # only `_rebuilt` runs: what a start with a rebuild resolves to
    starts._sources = _Approximating()  # type: ignore[assignment]
    assert rebuild is not None and starts._rebuilt(rebuild, config).num_frames == left
