"""vLLM-Omni 0.32's `streaming_pacing` in the session runtime (no Triton), on the built-in
generator: the next chunk waits while it would put the lead over the reported playhead past
`max_lead_ms`; each chunk carries `output_chunk_index` and `pacing`; a player that never
reports ends the session after `idle_timeout_s`; `stop_latency_s` follows a stop; a paced
session's ack carries `received_at`.

No timing asserts: the bounds checked are ones load can only help (fewer chunks, never more),
and waits have generous deadlines that only bound hangs."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from rtvideo.backend.loading.settings import BackendSettings
from rtvideo.backend.media.encoder import FragmentedMp4Encoder
from rtvideo.backend.runtime.manager import SessionManager
from rtvideo.backend.runtime.session import Limits
from rtvideo.backend.runtime.sources import GeneratorSources
from tests.support.recorder import Recorder
from tests.support.runtime_standins import SECRET, StandInGenerator
from tests.support.streams import check_server_message

CHUNK = 9 / 16  # seconds of one chunk at the built-in defaults


def manager() -> SessionManager:
    settings = BackendSettings(width=64, height=64, max_sessions=1)
    return SessionManager(
        sources=GeneratorSources(StandInGenerator(), FragmentedMp4Encoder),
        capabilities=settings.capabilities("realtime_video"),
        # a generous wall-clock lead, so that only the playhead bound holds the stream back
        limits=Limits(pacing_lead_chunks=50.0, max_session_seconds=120.0, stall_timeout_seconds=120.0),
        max_sessions=1,
        watchdog_interval=0.05,
    )


def request(mgr: SessionManager, message: dict[str, Any], *, start: bool = False, end: bool = False) -> Recorder:
    ch = Recorder()
    mgr.on_request(1, json.dumps(message).encode(), start=start, end=end, channel=ch, secret=SECRET)
    return ch


def media(ch: Recorder) -> list[dict[str, Any]]:
    return [m for m, _, _ in ch.sent if m and m.get("type") == "video.chunk_metadata" and m["kind"] == "media"]


def messages(ch: Recorder) -> list[dict[str, Any]]:
    return [m for m, _, _ in ch.sent if m]


def wait_for(predicate, what: str, timeout: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"no {what} after {timeout} s"
        time.sleep(0.01)


def start(mgr: SessionManager, **fields: Any) -> Recorder:
    return request(mgr, {"type": "session.start", "prompt": "a harbour", "seed": 1, **fields}, start=True)


def test_the_lead_over_the_reported_playhead_is_bounded_and_reported() -> None:
    mgr = manager()
    try:
        ch = start(mgr, streaming_pacing={"enabled": True, "mode": "client_playhead", "max_lead_ms": 1200})
        config = messages(ch)[0]["config"]
        assert config["streaming_pacing"]["max_lead_ms"] == 1200.0 and config["ignored_fields"] == []
        wait_for(lambda: len(media(ch)) >= 2, "two chunks")
        time.sleep(1.0)  # no report yet: 2 chunks (1.125 s) fit the 1.2 s lead, a third would not
        assert len(media(ch)) == 2
        request(mgr, {"type": "session.playback", "position_seconds": 1.0})  # the player is 1 s in
        wait_for(lambda: len(media(ch)) >= 3, "the chunk the report let through")
        time.sleep(1.0)
        assert len(media(ch)) <= 3 + 1  # at most what the 1.2 s lead lets ahead of 1.0 s
        for index, meta in enumerate(media(ch)):
            check_server_message(meta)
            assert meta["output_chunk_index"] == meta["generation_chunk_index"] == index
            pacing = meta["pacing"]
            assert set(pacing) == {"lead_seconds", "wait_seconds", "retained_bytes"}
            assert pacing["lead_seconds"] <= 1.2 + 1e-6 and pacing["retained_bytes"] == meta["byte_length"]
        assert media(ch)[2]["pacing"]["wait_seconds"] > 0  # it waited for the player
        ack = request(mgr, {"type": "session.interaction", "interaction": {"event_id": "e", "event": {"prompt": "x"}}})
        queued = messages(ack)[0]
        assert queued["type"] == "session.interaction.queued" and queued["received_at"] > 0
        check_server_message(queued)
        request(mgr, {"type": "session.stop"}, end=True)
        wait_for(lambda: messages(ch)[-1]["type"] == "session.done", "session.done")
        done = messages(ch)[-1]
        assert done["stopped"] is True and done["stop_latency_s"] >= 0
        check_server_message(done)
    finally:
        mgr.shutdown()


def test_a_player_that_never_reports_ends_the_session_after_its_idle_timeout() -> None:
    mgr = manager()
    try:
        ch = start(mgr, streaming_buffer_seconds=1.0, streaming_pacing=None)
        assert messages(ch)[0]["config"]["streaming_pacing"]["idle_timeout_s"] == 30.0
    finally:
        mgr.shutdown()
    mgr = manager()
    try:
        ch = start(mgr, streaming_pacing={"max_lead_ms": 600, "idle_timeout_s": 0.5})
        wait_for(lambda: messages(ch)[-1]["type"] == "session.done", "the idle end")
        errors = [m for m in messages(ch) if m["type"] == "error"]
        assert [e["code"] for e in errors] == ["stall_timeout"] and "idle_timeout_s" in errors[0]["message"]
        assert len(media(ch)) == 1  # one chunk fits 0.6 s; the next waited for a report that never came
        assert messages(ch)[-1]["chunks"] == 1  # no trailer pair after an ending error
        assert "stop_latency_s" not in messages(ch)[-1]
    finally:
        mgr.shutdown()


def test_an_unpaced_session_carries_none_of_it() -> None:
    mgr = manager()
    try:
        ch = start(mgr, num_frames=18)
        wait_for(lambda: messages(ch)[-1]["type"] == "session.done", "session.done")
        assert all("pacing" not in m and "output_chunk_index" not in m for m in media(ch))
        assert "streaming_pacing" not in messages(ch)[0]["config"]
    finally:
        mgr.shutdown()


@pytest.mark.parametrize(
    "fields",
    [
        {"streaming_pacing": {"max_lead_ms": 100}},  # shorter than one chunk (0.5625 s)
        {"streaming_pacing": {}, "streaming_buffer_seconds": 1.0},  # both names at once
        {"streaming_pacing": {"mode": "wall_clock"}},
        {"streaming_pacing": {"max_lead_ms": 0}},
        {"streaming_pacing": {"max_lead_ms": 10_001}},
        {"streaming_pacing": {"max_output_bytes": 1.5}},
        {"streaming_pacing": {"idle_timeout_s": -1}},
        {"streaming_pacing": {"enabled": "yes"}},
        {"streaming_pacing": {"lead": 1}},
        {"streaming_pacing": [1]},
    ],
)
def test_what_0_32_refuses_is_invalid_start(fields: dict[str, Any]) -> None:
    mgr = manager()
    try:
        ch = start(mgr, **fields)
        first = messages(ch)[0]
        assert first["type"] == "error" and first["code"] == "invalid_start", first
    finally:
        mgr.shutdown()


def test_a_chunk_over_max_output_bytes_ends_the_session_unsent() -> None:
    mgr = manager()
    try:
        ch = start(mgr, streaming_pacing={"max_output_bytes": 100})  # any encoded chunk is larger
        wait_for(lambda: messages(ch)[-1]["type"] == "session.done", "the end")
        errors = [m for m in messages(ch) if m["type"] == "error"]
        assert [e["code"] for e in errors] == ["generation_failed"] and "max_output_bytes" in errors[0]["message"]
        assert media(ch) == [] and messages(ch)[-1]["chunks"] == 0
    finally:
        mgr.shutdown()
