"""A branch or a move of a vLLM-Omni session plays what is left of its length, whether its start
gave `num_frames` or `seconds` (rtvideo.core.approximation carries the frames shown before the
cut; the model takes them off the length it resolves at its own fps, as its `video.start` says)."""

from __future__ import annotations

import json
import queue
import time
from typing import Any

import pytest

from rtvideo.backend.loading.settings import BackendSettings
from rtvideo.backend.runtime.manager import SessionManager
from rtvideo.backend.runtime.session import Limits
from rtvideo.core.approximation import approximate_start
from tests.support.recorder import Recorder
from tests.support.runtime_standins import SECRET


class _Idle:
    """A session's source that makes nothing until it is interrupted."""

    pacing = False

    def __init__(self) -> None:
        self._items: queue.Queue[None] = queue.Queue()

    def admit_event(self, interaction: Any) -> None:
        pass

    def next_chunk(self, max_frames: int) -> None:
        return self._items.get()

    def interrupt(self) -> None:
        self._items.put(None)

    def close(self) -> bytes:
        return b""


class _Approximating:
    """Sources that approximate a rebuild, as `EngineSources` do."""

    approximates = True

    def open(self, config: Any, request_id: str) -> _Idle:
        return _Idle()

    def close(self) -> None:
        pass


@pytest.mark.parametrize(
    ("length", "left"),
    [({"num_frames": 100}, 76), ({"seconds": 5}, 56), ({"seconds": 1}, 1), ({}, 1452)],
)
def test_a_branch_or_move_plays_what_is_left_of_its_length(length: dict[str, Any], left: int) -> None:
    """At 16 fps 5 s are 80 frames: 24 were shown, 56 are left (1 s, shorter than what was shown:
    one frame). An open-ended start gets its new engine request's whole cap (1452 at 640x384)."""
    given = {"type": "session.start", "prompt": "a harbour", **length}
    start = approximate_start(given, seed=7, at=6, events=(), image_url=None, frames_before=24)
    manager = SessionManager(
        sources=_Approximating(),  # type: ignore[arg-type]
        capabilities=BackendSettings(generator="vllm_omni", width=640, height=384).capabilities("m"),
        limits=Limits(pacing_lead_chunks=None, max_session_seconds=60.0, stall_timeout_seconds=60.0),
        max_sessions=1,
    )
    channel = Recorder()
    try:
        manager.on_request(1, json.dumps(start).encode(), start=True, end=False, channel=channel, secret=SECRET)
        deadline = time.monotonic() + 10
        while not any(m and m["type"] == "video.start" for m, _, _ in channel.sent):
            assert time.monotonic() < deadline and not channel.finished.is_set(), channel.sent
            time.sleep(0.01)
    finally:
        manager.shutdown()
    (video_start,) = [m for m, _, _ in channel.sent if m and m["type"] == "video.start"]
    assert video_start["config"]["num_frames"] == left
