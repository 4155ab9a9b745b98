"""`session.playback` through the proxy, without Triton: forwarded verbatim, never answered
within the rate, not counted in flight; a malformed one is `invalid_message`; and the
on-screen histograms computed from the reports (`PlayheadTiming`)."""

from __future__ import annotations

import json
from typing import Any

from rtvideo.core import protocol
from rtvideo.proxy.observability.metrics import ProxyMetrics, value
from rtvideo.proxy.observability.session_timing import MAX_TRACKED_EVENTS, PlayheadTiming
from rtvideo.triton.wire import START_TAG
from tests.support.fake_bridge import begin, chunk, ended, kinds, reply, run, session, settle
from tests.support.probes import tracked


def playback(position: float, **more: Any) -> str:
    return json.dumps({"type": "session.playback", "position_seconds": position, **more})


def test_reports_are_forwarded_never_answered_and_not_in_flight() -> None:
    async def body() -> tuple[list[Any], list[tuple[bytes, bool, bool]], int, int]:
        s, conn, bridge = session(max_requests_in_flight=1)
        begin(s)
        s.on_reply(reply(START_TAG, {"type": "video.start", "request_id": "r", "config": {"fps": 16}}))
        for n in range(10):
            s.steering.frame(s.owner, playback(n * 0.25, buffered_seconds=0.5), False)
        s.steering.frame(s.owner, playback(-1), False)  # malformed: the only report answered
        await settle()
        in_flight = s.upstream.in_flight
        s.steering.frame(s.owner, json.dumps({"type": "session.stop"}), False)
        await ended(s, conn)
        return conn.frames, bridge.streams[0].sent, in_flight, value(s.metrics.reported_lead_seconds, "_count")

    frames, sent, in_flight, leads = run(body())
    forwarded = [json.loads(raw) for raw, _, _ in sent if b"session.playback" in raw]
    assert [m["position_seconds"] for m in forwarded] == [n * 0.25 for n in range(10)]
    errors = [k for k in kinds(frames) if k[0] == "error"]
    assert errors == [("error", "invalid_message")], kinds(frames)
    assert in_flight == 0 and leads == 10


def test_reports_over_the_rate_are_rate_limited_like_any_message() -> None:
    async def body() -> list[Any]:
        s, conn, _ = session(max_messages_per_second=0.001, message_burst=2)
        begin(s)
        s.on_reply(reply(START_TAG, {"type": "video.start", "request_id": "r", "config": {"fps": 16}}))
        for n in range(3):
            s.steering.frame(s.owner, playback(n), False)
        await settle()
        s.steering.frame(s.owner, json.dumps({"type": "session.stop"}), False)
        await ended(s, conn)
        return conn.frames

    errors = [k for k in kinds(run(body())) if k[0] == "error"]
    assert errors == [("error", "rate_limited")]  # the third; the two within the burst are not answered


class Clock:
    def __init__(self) -> None:
        self.now = 10.0

    def __call__(self) -> float:
        return self.now


def media(index: int, started: list[str], frames: int = 9) -> dict[str, Any]:
    return {**chunk(index, 1).message, "num_frames": frames, "started_event_ids": started}  # type: ignore[dict-item]


def test_playhead_timing_measures_send_to_shown_from_the_reports() -> None:
    metrics, clock = ProxyMetrics(), Clock()
    timing = PlayheadTiming(metrics, clock)
    timing.taken({"type": protocol.VIDEO_START, "config": {"fps": 16}})
    timing.taken(media(0, []))
    timing.sent("e1", 10.0)  # sent at 10.0
    timing.taken(media(1, ["e1"]))  # its first chunk starts at 9/16 s of media
    clock.now = 10.5
    timing.report(0.5, None)  # not there yet
    assert value(metrics.interaction_visible_seconds, "_count") == 0
    clock.now = 10.8
    timing.report(0.6625, 0.4)  # 0.1 s past its start: shown at 10.7
    assert (
        value(metrics.interaction_visible_seconds, "_count") == 1
        and value(metrics.reported_lead_seconds, "_count") == 2
    )
    text = metrics.render()
    assert "rtvideo_proxy_interaction_visible_seconds_sum 0.7" in text
    timing.report(5.0, None)  # counted once
    assert value(metrics.interaction_visible_seconds, "_count") == 1


def test_playhead_timing_stays_bounded_and_silent_without_reports() -> None:
    metrics = ProxyMetrics()
    timing = PlayheadTiming(metrics, Clock())
    timing.taken({"type": protocol.VIDEO_START, "config": {"fps": 16}})
    for n in range(MAX_TRACKED_EVENTS * 3):
        timing.sent(f"e{n}", 1.0)
        timing.taken(media(n, [f"e{n}"]))
    assert max(tracked(timing)) <= MAX_TRACKED_EVENTS
    assert (
        value(metrics.interaction_visible_seconds, "_count") == 0
        and value(metrics.reported_lead_seconds, "_count") == 0
    )
