"""The rules behind the playback metrics: underruns from playhead reports, late chunks in
pacing's view, the realtime factor, and in-band `session.metrics` (no server needed)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from prometheus_client.parser import text_string_to_metric_families

from rtvideo.backend.runtime import metrics as model_metrics
from rtvideo.core.chunks import chunk_timing, realtime_factor
from rtvideo.core.event_book import Outcome
from rtvideo.proxy.observability.inband import InbandMetrics
from rtvideo.proxy.observability.metrics import ProxyMetrics
from rtvideo.proxy.observability.playback_metrics import LateChunks, Underrun, UnderrunDetector
from rtvideo.proxy.observability.session_timing import PlayheadTiming, StreamTiming


def reports(detector: UnderrunDetector, rows: list[tuple[float, float, float]]) -> list[Underrun]:
    return [change for at, pos, buf in rows if (change := detector.report(at, pos, buf)) is not None]


def ticks(start: float, stop: float, step: float = 0.25) -> Iterator[float]:
    t = start
    while t <= stop + 1e-9:
        yield t
        t += step


def test_a_player_that_stops_for_three_seconds_is_one_underrun_of_three_seconds() -> None:
    detector = UnderrunDetector()
    rows = [(0.0, 0.0, 0.0), (0.5, 0.5, 0.6), (1.0, 1.0, 0.1)]  # playing
    rows += [(t, 1.1, 0.0) for t in ticks(1.25, 4.25)]  # stands still, nothing buffered, 3 s
    rows += [(4.5, 1.35, 0.5), (4.75, 1.6, 0.5)]  # a chunk came: it played 0.25 s since
    changes = reports(detector, rows)
    assert [c.began for c in changes] == [True, False]
    assert changes[1].seconds == pytest.approx(3.0)
    assert detector.finish() is None


def test_no_underrun_while_waiting_for_the_first_frame_paused_with_a_buffer_or_after_the_end() -> None:
    detector = UnderrunDetector()
    assert reports(detector, [(t, 0.0, 0.0) for t in ticks(0, 3)]) == []  # the first chunk is late
    assert reports(detector, [(3.5, 0.5, 1.0)] + [(t, 0.5, 1.0) for t in ticks(4, 8)]) == []  # paused
    detector.stream_ended()
    assert reports(detector, [(t, 1.5, 0.0) for t in ticks(9, 12)]) == []  # at the end of a done stream


def test_an_underrun_open_at_the_end_lasts_to_its_last_still_report() -> None:
    detector = UnderrunDetector()
    changes = reports(detector, [(0.0, 1.0, 0.5), (1.0, 2.0, 0.0), (1.5, 2.0, 0.0), (2.5, 2.0, 0.0)])
    assert [c.began for c in changes] == [True]
    ended = detector.finish()
    assert ended is not None and not ended.began and ended.seconds == pytest.approx(1.5)


def test_late_chunks_count_once_per_stall_in_pacings_view() -> None:
    late = LateChunks()
    assert not late.chunk(10.0, 0.5)  # the player starts here
    assert not late.chunk(10.4, 0.5)  # needed at 10.5: early
    assert late.chunk(12.0, 0.5)  # needed at 11.0: late; the player waited for it
    assert not late.chunk(12.5, 0.5)  # needed at 12.5 on the re-based clock: in time
    assert late.chunk(13.2, 0.5)


def test_the_realtime_factor_is_media_seconds_per_second_of_making() -> None:
    assert realtime_factor(9, 16, 0.25, 0.03125) == pytest.approx(2.0)
    assert realtime_factor(16, 16, 1.5, 0.5) == pytest.approx(0.5)
    assert realtime_factor(9, 16, 0.0, 0.0) is None and realtime_factor(0, 16, 1.0, 0.0) is None
    assert chunk_timing(8, 16, 0.5, 0.5) == {"generate_seconds": 0.5, "encode_seconds": 0.5, "realtime_factor": 0.5}
    buffered = model_metrics.BufferedMetrics()
    buffered.observe_chunk(1.0, 0.0, 8, 100, 16)
    buffered.observe_chunk(0.0, 0.0, 8, 100, 16)  # unmeasured: no factor
    drained = buffered.drain()
    assert drained.observations[model_metrics.REALTIME_FACTOR] == [0.5]
    assert drained.observations[model_metrics.GENERATE_DURATION] == [1.0, 0.0]
    assert buffered.drain().observations == {}


def scrape(metrics: ProxyMetrics) -> dict[str, float]:
    return {
        s.name + str(sorted(s.labels.items())): s.value
        for f in text_string_to_metric_families(metrics.render())
        for s in f.samples
    }


def test_the_timings_export_underruns_late_chunks_and_ack_to_screen() -> None:
    now = [0.0]
    metrics = ProxyMetrics()
    stream, playhead = StreamTiming(metrics, clock=lambda: now[0]), PlayheadTiming(metrics, clock=lambda: now[0])
    start = {"type": "video.start", "config": {"fps": 10}}
    stream.taken(start)
    playhead.taken(start)
    playhead.sent("e1", 0.0)  # acked at 0.0
    for i, at in enumerate((0.0, 1.0, 3.5)):  # 1 s chunks; the third is 1.5 s late
        now[0] = at
        chunk = {"type": "video.chunk_metadata", "kind": "media", "num_frames": 10}
        chunk["started_event_ids"] = ["e1"] if i == 1 else []
        stream.taken(chunk)
        playhead.taken(chunk)
    for at, pos, buf in ((1.2, 0.5, 2.5), (2.2, 1.5, 0.5), (2.5, 2.0, 0.0), (3.0, 2.0, 0.0)):
        now[0] = at
        playhead.report(pos, buf)
    assert playhead.buffered_seconds == 0.0
    now[0] = 4.0
    playhead.finish()
    got = scrape(metrics)
    assert got["rtvideo_delivery_late_chunks_total[]"] == 1
    assert got["rtvideo_playback_underruns_total[]"] == 1
    assert got["rtvideo_playback_underrun_seconds_sum[]"] == pytest.approx(0.5)
    # e1's chunk starts at 1.0 s of media; the report at 2.2 s at 1.5 s shows it was on screen at 1.7 s
    assert got["rtvideo_interaction_to_screen_seconds_sum[]"] == pytest.approx(1.7)
    assert got["rtvideo_interaction_to_screen_seconds_count[]"] == 1


@dataclass(frozen=True)
class _Figures:  # what InbandMetrics reads of its session's phase, playhead and event book
    request_id: str = "video_stream-" + "0" * 32
    buffered_seconds: float = 0.75

    def outcome(self, *, acked_only: bool = False) -> Outcome:
        return Outcome(unapplied=("e1", "e2"), unfinished=())  # two queued events


def test_session_metrics_go_out_at_most_once_a_second_and_only_when_asked() -> None:
    async def body() -> tuple[list[dict], list[dict]]:
        now = [0.0]
        out: dict[bool, list[dict]] = {True: [], False: []}
        for asked in (True, False):
            inband = InbandMetrics(
                lambda build, asked=asked: out[asked].append(dict(build())),
                _Figures(),
                _Figures(),
                _Figures(),
                clock=lambda: now[0],
            )
            inband.asked({"type": "session.start", "prompt": "x", "metrics": asked})
            for i in range(6):  # a chunk every 0.4 s
                now[0] = i * 0.4
                meta = {"type": "video.chunk_metadata", "kind": "media", "transport_chunk_index": i}
                meta |= {"generation_chunk_index": i, "timing": chunk_timing(8, 16, 0.25, 0.05)}
                inband.arrived(meta)
                now[0] += 0.01
                inband.taken(meta)
                await asyncio.sleep(0)
        return out[True], out[False]

    asked, not_asked = asyncio.run(body())
    assert not_asked == []
    assert [m["transport_chunk_index"] for m in asked] == [0, 3]  # 0.0 s, then 1.2 s (0.8 s is too soon)
    first = asked[0]
    assert first["type"] == "session.metrics" and first["queued_events"] == 2 and first["buffered_seconds"] == 0.75
    assert first["delivery_seconds"] == pytest.approx(0.01)
    assert first["realtime_factor"] == pytest.approx(round(0.5 / 0.3, 3))
    assert first["generate_seconds"] == 0.25 and first["encode_seconds"] == 0.05
