"""Pacing to `session.playback` reports in the session runtime (no Triton): a report is never
answered but with FINAL, a frozen player holds the stream back (bounded), a client that stops
reporting gets the fixed lead back, and a lying one never makes the stream faster.

Every timing check is a bound that load can only help (fewer chunks, never more), or a wait
with a generous deadline."""

from __future__ import annotations

import json
import time
from typing import Any

from rtvideo.backend.loading.settings import BackendSettings
from rtvideo.backend.media.encoder import FragmentedMp4Encoder
from rtvideo.backend.runtime.manager import SessionManager
from rtvideo.backend.runtime.session import Limits
from rtvideo.backend.runtime.sources import GeneratorSources
from tests.support.recorder import Recorder
from tests.support.runtime_standins import SECRET, StandInGenerator

CHUNK = 9 / 16


def manager(playback_pacing: bool = True) -> SessionManager:
    settings = BackendSettings(width=64, height=64, max_sessions=1)
    return SessionManager(
        sources=GeneratorSources(StandInGenerator(), FragmentedMp4Encoder),
        capabilities=settings.capabilities("realtime_video"),
        limits=Limits(
            pacing_lead_chunks=1.0,
            max_session_seconds=60.0,
            stall_timeout_seconds=60.0,
            playback_pacing=playback_pacing,
        ),
        max_sessions=1,
        watchdog_interval=0.05,
    )


def request(mgr: SessionManager, message: dict[str, Any], *, start: bool = False, end: bool = False) -> Recorder:
    ch = Recorder()
    mgr.on_request(1, json.dumps(message).encode(), start=start, end=end, channel=ch, secret=SECRET)
    return ch


def chunks(ch: Recorder) -> int:
    return sum(1 for m, _, _ in ch.sent if m and m.get("type") == "video.chunk_metadata" and m["kind"] == "media")


def wait_chunks(ch: Recorder, count: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while chunks(ch) < count:
        assert time.monotonic() < deadline, f"only {chunks(ch)} chunks after {timeout} s"
        time.sleep(0.01)


def report(mgr: SessionManager, position: float, **more: float) -> Recorder:
    return request(mgr, {"type": "session.playback", "position_seconds": position, **more})


def stop(mgr: SessionManager, stream: Recorder) -> None:
    request(mgr, {"type": "session.stop"}, end=True)
    assert stream.finished.wait(10)


def test_a_report_completes_flags_only_and_a_malformed_one_is_invalid_message() -> None:
    mgr = manager()
    stream = request(mgr, {"type": "session.start", "prompt": "p", "fps": 16}, start=True)
    wait_chunks(stream, 1)
    answer = report(mgr, 0.0, buffered_seconds=0.5)
    assert answer.sent == [(None, b"", True)]
    bad = report(mgr, -1.0)
    assert bad.types() == ["error"] and bad.sent[0][0]["code"] == "invalid_message" and bad.sent[0][2] is True
    stop(mgr, stream)
    assert "error" not in stream.types()
    mgr.shutdown()


def test_a_frozen_player_holds_the_stream_back_then_the_fixed_lead_returns() -> None:
    """Reports of position 0 every 0.1 s: the player is ever further behind, so for 1.5 s at most
    the one chunk already due goes out (the fixed lead would send 2-3). Once the reports stop,
    the stream goes on at the fixed lead."""
    mgr = manager()
    stream = request(mgr, {"type": "session.start", "prompt": "p", "fps": 16}, start=True)
    wait_chunks(stream, 3)
    before = chunks(stream)
    until = time.monotonic() + 1.5
    while time.monotonic() < until:
        assert report(mgr, 0.0).sent == [(None, b"", True)]
        time.sleep(0.1)
    held = chunks(stream) - before
    assert held <= 1, f"{held} chunks went out while the player reported it was frozen"
    wait_chunks(stream, chunks(stream) + 3)  # reports stopped: stale after 1.5 s, fixed lead again
    stop(mgr, stream)
    mgr.shutdown()


def test_a_report_ahead_of_what_was_sent_never_makes_the_stream_faster() -> None:
    """Absurd positions (far beyond what was sent) are clamped: over 2 s at most the fixed
    lead's chunks go out (2 s / chunk + the lead + the one in hand)."""
    mgr = manager()
    stream = request(mgr, {"type": "session.start", "prompt": "p", "fps": 16}, start=True)
    wait_chunks(stream, 2)
    before, began = chunks(stream), time.monotonic()
    while time.monotonic() - began < 2.0:
        report(mgr, 1e6, buffered_seconds=0.0)
        time.sleep(0.05)
    sent = chunks(stream) - before
    assert sent <= (time.monotonic() - began) / CHUNK + 2, f"{sent} chunks in 2 s: faster than the fixed lead"
    stop(mgr, stream)
    mgr.shutdown()


def test_with_playback_pacing_off_reports_are_ignored() -> None:
    mgr = manager(playback_pacing=False)
    stream = request(mgr, {"type": "session.start", "prompt": "p", "fps": 16}, start=True)
    wait_chunks(stream, 2)
    assert report(mgr, 0.0).sent == [(None, b"", True)]
    wait_chunks(stream, chunks(stream) + 2)
    assert all("playback_lead_seconds" not in m for m, _, _ in stream.sent if m)
    stop(mgr, stream)
    mgr.shutdown()


def test_chunks_carry_the_servers_view_of_the_lead_only_while_reports_come() -> None:
    mgr = manager()
    stream = request(mgr, {"type": "session.start", "prompt": "p", "fps": 16}, start=True)
    wait_chunks(stream, 2)
    metas = [m for m, _, _ in stream.sent if m and m.get("type") == "video.chunk_metadata"]
    assert all("playback_lead_seconds" not in m for m in metas)  # a client without reports sees today's
    mark = len(stream.sent)
    began = time.monotonic()
    while chunks(stream) < 4 and time.monotonic() - began < 30:
        report(mgr, max(0.0, (chunks(stream) - 1) * CHUNK))
        time.sleep(0.1)
    leads = [m.get("playback_lead_seconds") for m, _, _ in stream.sent[mark:] if m and m.get("kind") == "media"]
    assert leads and all(isinstance(lead, float) and lead >= 0 for lead in leads), leads
    stop(mgr, stream)
    mgr.shutdown()


def test_a_frozen_player_cannot_slow_the_stream_below_real_time() -> None:
    """Reports of position 0 for 8 s: after the bounded hold (at most max_behind_seconds, 2 s,
    plus the fixed lead's chunk) chunks go out at real time again, about 9 in the window; a
    re-base that took the hold for a pause would let each chunk be held anew (about 4)."""
    mgr = manager()
    stream = request(mgr, {"type": "session.start", "prompt": "p", "fps": 16}, start=True)
    wait_chunks(stream, 2)
    before, began = chunks(stream), time.monotonic()
    while time.monotonic() - began < 8.0:
        report(mgr, 0.0)
        time.sleep(0.1)
    sent = chunks(stream) - before
    assert sent >= 7, f"{sent} chunks in 8 s: a frozen player slowed the stream below real time"
    stop(mgr, stream)
    mgr.shutdown()


def test_a_report_that_races_the_end_is_not_answered() -> None:
    """The client sends reports until it reads session.done: one the model takes after its
    session ended completes flags-only, as a stop that raced the end does (an error would be an
    answer to a report within the rate, which the protocol rules out)."""
    mgr = manager()
    try:
        ch = request(mgr, {"type": "session.start", "prompt": "a red fire", "num_frames": 9}, start=True)
        assert ch.finished.wait(30), ch.types()  # the session ran to its end
        late = report(mgr, 0.5, buffered_seconds=0.0)
        assert late.sent == [(None, b"", True)], late.sent
        other = request(mgr, {"type": "session.interaction", "interaction": {"event": {"prompt": "q"}}})
        assert other.types() == ["error"]  # anything else is still told the session has ended
    finally:
        mgr.shutdown()
