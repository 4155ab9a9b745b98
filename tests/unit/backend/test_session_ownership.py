"""A session belongs to the stream that started it (docs/protocol.md §8), without Triton: the
session manager takes a sequence's later requests only with the secret its start carried.
tests/e2e/test_session_ownership.py runs the same attacks through a real tritonserver."""

from __future__ import annotations

import json
import threading
import time
from typing import Any, cast

import numpy as np

from rtvideo.backend.loading.settings import BackendSettings
from rtvideo.backend.media.encoder import FragmentedMp4Encoder
from rtvideo.backend.runtime.manager import MIN_SECRET_CHARS, NOT_YOURS, SessionManager
from rtvideo.backend.runtime.ports import VideoGenerator
from rtvideo.backend.runtime.session import Limits
from rtvideo.backend.runtime.sources import GeneratorSources
from rtvideo.triton import wire
from rtvideo.triton.access import SESSION_SECRET_PARAMETER
from tests.support.recorder import Recorder

OWNER = "the-owner-s-secret-0123456789"
OTHER = "somebody-else-s-secret-98765"
PING = b'{"type":"session.ping"}'
STOP = b'{"type":"session.stop"}'


class _Frames:
    """A generator that renders only while `running` is set (so no chunk moves a session's clock)."""

    def __init__(self) -> None:
        self.running = threading.Event()
        self.running.set()

    def open_session(self, *, width: int, height: int, seed: int, fps: int | None = None) -> _Frames:
        self.shape = (height, width, 3)
        return self

    def generate(self, mix: Any, num_frames: int) -> np.ndarray:
        self.running.wait(10)
        time.sleep(0.01)
        return np.full((num_frames, *self.shape), 90, np.uint8)

    def close(self) -> None:
        pass


def _manager(max_sessions: int = 2, frames: _Frames | None = None) -> SessionManager:
    settings = BackendSettings(width=64, height=64, max_sessions=max_sessions)
    return SessionManager(
        sources=GeneratorSources(cast(VideoGenerator, frames or _Frames()), FragmentedMp4Encoder),
        capabilities=settings.capabilities("realtime_video"),
        limits=Limits(pacing_lead_chunks=1.0, max_session_seconds=60.0, stall_timeout_seconds=60.0),
        max_sessions=max_sessions,
        watchdog_interval=0.05,
    )


def _start(mgr: SessionManager, secret: str | None, corrid: int = 7, *, end: bool = False) -> Recorder:
    ch = Recorder()
    start = json.dumps({"type": "session.start", "prompt": "p"}).encode()
    mgr.on_request(corrid, start, start=True, end=end, channel=ch, secret=secret)
    return ch


def _interaction(event_id: str) -> bytes:
    return json.dumps(
        {"type": "session.interaction", "interaction": {"event_id": event_id, "event": {"prompt": "q"}}}
    ).encode()


def _one(mgr: SessionManager, payload: bytes, secret: str | None, *, corrid: int = 7, end: bool = False) -> Recorder:
    ch = Recorder()
    mgr.on_request(corrid, payload, start=False, end=end, channel=ch, secret=secret)
    assert ch.finished.wait(5)
    return ch


def _message(ch: Recorder, index: int) -> dict[str, Any]:
    message = ch.sent[index][0]
    assert message is not None, ch.sent
    return message


def _named_events(ch: Recorder) -> set[str]:
    """Every event id the session's stream mentions (started, completed, superseded, lists)."""
    seen: set[str] = set()
    for message, _, _ in ch.sent:
        for value in (message or {}).values():
            if isinstance(value, list):
                seen.update(v for v in value if isinstance(v, str))
    return seen


def test_a_start_must_carry_a_secret_of_16_characters() -> None:
    mgr = _manager()
    try:
        for secret in (None, "", "x" * (MIN_SECRET_CHARS - 1)):
            ch = _start(mgr, secret)
            assert ch.finished.wait(5)
            assert ch.types() == ["error", "session.done"], ch.sent
            error = ch.sent[0][0]
            assert error is not None and error["code"] == "invalid_start"
            assert SESSION_SECRET_PARAMETER in error["message"]
        assert mgr.active_sessions == 0
        # the health probe needs none
        probe = Recorder()
        mgr.on_request(99, PING, start=True, end=True, channel=probe, secret=None)
        assert probe.sent == [({"type": "session.pong"}, b"", True)]  # a plain ping, the plain pong
        asking = Recorder()  # the proxy's probe asks for the model's status
        mgr.on_request(98, b'{"type":"session.ping","status":true}', start=True, end=True, channel=asking, secret=None)
        assert asking.sent == [({"type": "session.pong", "model": {"max_sessions": 2, "sessions": 0}}, b"", True)]
    finally:
        mgr.shutdown()


def test_requests_without_the_session_s_secret_change_nothing() -> None:
    frames = _Frames()
    mgr = _manager(frames=frames)
    try:
        owner = _start(mgr, OWNER)
        request_id = _message(owner, 0)["request_id"]
        frames.running.clear()  # no chunk refreshes the session's clock meanwhile
        time.sleep(0.2)
        session = mgr.session_for(7)
        assert session is not None
        session.stats.last_progress = clock = time.monotonic() - 30.0  # so a refresh would show
        for secret in (None, OTHER, OWNER[:-1], OWNER + "x", "é" * 20):
            for payload, end in ((_interaction("injected"), False), (PING, False), (STOP, True), (PING, True)):
                answer = _one(mgr, payload, secret, end=end)
                assert answer.sent == [({"type": "error", "code": "invalid_message", "message": NOT_YOURS}, b"", True)]
            # a second start on the live id: refused, the session runs on
            replace = _start(mgr, secret)
            assert replace.finished.wait(5) and replace.types() == ["error", "session.done"]
            assert _message(replace, 0)["code"] == "invalid_start" and request_id not in json.dumps(
                [m for m, _, _ in replace.sent]
            )
            # the probe's shape on the live id is a start too
            probe = Recorder()
            mgr.on_request(7, PING, start=True, end=True, channel=probe, secret=secret)
            assert probe.types() == ["error", "session.done"] and _message(probe, 0)["code"] == "invalid_start"
        assert mgr.active_sessions == 1 and not owner.finished.is_set()
        assert session.stats.last_progress == clock, "a stranger's request refreshed the session's clock"
        frames.running.set()
        # the owner's own requests still work
        assert _one(mgr, PING, OWNER).sent == [({"type": "session.pong"}, b"", True)]
        ack = _one(mgr, _interaction("mine"), OWNER)
        assert ack.sent[0][0] == {"type": "session.interaction.queued", "request_id": request_id, "event_id": "mine"}
        _one(mgr, STOP, OWNER, end=True)
        assert owner.finished.wait(10)
        done = owner.sent[-1][0]
        assert done is not None and done["type"] == "session.done" and done["stopped"] is True
        assert "injected" not in _named_events(owner), "the injected interaction reached the session"
        # late requests: the owner hears the session ended, anyone else nothing of it
        late = _one(mgr, PING, OWNER)
        assert late.sent[0][0] == {
            "type": "error",
            "code": "invalid_message",
            "message": "the session has ended",
            "request_id": request_id,
        }
        assert _one(mgr, PING, OTHER).sent[0][0] == {"type": "error", "code": "invalid_message", "message": NOT_YOURS}
    finally:
        mgr.shutdown()


def test_a_restart_with_the_same_secret_replaces_the_session() -> None:
    mgr = _manager()
    try:
        first = _start(mgr, OWNER)
        second = _start(mgr, OWNER)
        assert first.finished.wait(10) and _message(first, -1)["stopped"] is True
        assert second.types()[0] == "video.start" and mgr.active_sessions == 1
        _one(mgr, STOP, OWNER, end=True)
        assert second.finished.wait(10)
    finally:
        mgr.shutdown()


def test_the_secret_travels_as_a_request_parameter() -> None:
    params = wire.secret_parameters(OWNER)
    assert params == {"rtvideo_session_secret": OWNER} and wire.secret_parameters(None) is None
    # pb_utils' request.parameters(): the request's parameters as a JSON object in text
    assert wire.session_secret(json.dumps(params)) == OWNER
    for text in (None, "", "{}", "[]", "not json", '{"rtvideo_session_secret": 5}', '{"other": "x"}'):
        assert wire.session_secret(text) is None
