"""A resolved session (`SessionConfig`) for the tests that make one by hand instead of resolving
a start: one place for the fields each such test does not care about."""

from __future__ import annotations

from typing import Any

from rtvideo.core.session_config import SessionConfig

#: a small open-ended session: 64x64 fragmented MP4 at 16 fps, 9 frames a chunk, 3 chunks a transition
DEFAULTS: dict[str, Any] = {
    "prompt": "src",
    "format": "fmp4",
    "model": "m",
    "width": 64,
    "height": 64,
    "fps": 16,
    "frames_per_chunk": 9,
    "default_transition_chunks": 3,
    "num_frames": None,
    "seed": 0,
}


def session_config(**fields: Any) -> SessionConfig:
    """`DEFAULTS`, with `fields` in place of any of them (and any other field of `SessionConfig`)."""
    return SessionConfig(**{**DEFAULTS, **fields})
