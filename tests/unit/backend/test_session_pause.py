"""A paused session (the proxy's detached session, docs/triton-model.md "Pausing a session"):
it stops at the next chunk boundary, holds its slot, and its stall and session-length clocks
stand still; unpaused, it goes on."""

from __future__ import annotations

import json
import time

from rtvideo.backend.loading.settings import BackendSettings
from rtvideo.backend.media.encoder import FragmentedMp4Encoder
from rtvideo.backend.runtime.manager import SessionManager
from rtvideo.backend.runtime.session import Limits
from rtvideo.backend.runtime.sources import GeneratorSources
from tests.support.recorder import Recorder
from tests.support.runtime_standins import SECRET, StandInGenerator

PAUSE = b'{"type": "session.ping", "keepalive": true, "pause": true}'
UNPAUSE = b'{"type": "session.ping", "keepalive": true, "pause": false}'


def _manager(stall: float, length: float) -> SessionManager:
    settings = BackendSettings(width=64, height=64, max_sessions=2)
    return SessionManager(
        sources=GeneratorSources(StandInGenerator("ok"), FragmentedMp4Encoder),
        capabilities=settings.capabilities("realtime_video"),
        limits=Limits(pacing_lead_chunks=None, max_session_seconds=length, stall_timeout_seconds=stall),
        max_sessions=2,
        watchdog_interval=0.05,
        idle_timeout_seconds=None,
    )


def _send(mgr: SessionManager, payload: bytes) -> Recorder:
    ch = Recorder()
    mgr.on_request(1, payload, start=False, end=False, channel=ch, secret=SECRET)
    return ch


def _chunks(ch: Recorder) -> int:
    return ch.types().count("video.chunk_metadata")


def test_a_paused_session_generates_nothing_and_outlives_its_clocks() -> None:
    mgr = _manager(stall=0.3, length=1.0)
    ch = Recorder()
    start = json.dumps({"type": "session.start", "prompt": "p", "fps": 16}).encode()
    mgr.on_request(1, start, start=True, end=False, channel=ch, secret=SECRET)
    deadline = time.monotonic() + 5
    while _chunks(ch) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    pong = _send(mgr, PAUSE)
    assert pong.types() == ["session.pong"]
    time.sleep(0.2)  # the chunk in hand is finished and sent
    held = _chunks(ch)
    time.sleep(1.5)  # longer than the stall timeout and the session-length limit
    assert _chunks(ch) == held and not ch.finished.is_set() and mgr.active_sessions == 1
    _send(mgr, UNPAUSE)
    while _chunks(ch) <= held and time.monotonic() < deadline + 5:
        time.sleep(0.01)
    assert _chunks(ch) > held
    assert ch.finished.wait(5)  # the session-length limit, counted without the pause
    assert ch.types()[-1] == "session.done"
    mgr.shutdown()
