"""Issue 31 through a real Triton and a real proxy: in-band `session.metrics` (asked and not
asked), an underrun measured from a player's reports, and the new metric families on both
`/metrics` (the proxy's and Triton's)."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
import urllib.request
from pathlib import Path

from tests.e2e.test_record import run_record
from tests.support.promql import scrape_series
from tests.support.proxy_client import NO_KEEPALIVE, Ws, ws
from tests.support.proxy_host import run
from tests.support.streams import PACED_MODEL, check_server_message, wait_for_metric


def proxy_text(port: int) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()


def test_session_metrics_only_when_asked_ordered_with_the_chunks(proxies) -> None:
    """A paced session of ~3 s with `"metrics": true` gets `session.metrics` after chunk pairs, at
    most one a second, each about the chunk just before it, with the player's buffer from its
    reports and the events waiting; chunks carry `timing`. The same session without the option
    sees none of it (no session.metrics, no timing, no config.metrics)."""
    url = proxies.url(model=PACED_MODEL)

    async def session(asked: bool) -> tuple[dict, list[dict], list[float]]:
        arrivals: list[float] = []
        async with ws(url, **NO_KEEPALIVE) as conn:
            s = Ws(conn)
            fields = {"metrics": True} if asked else {}
            start = await s.start("a harbour at dusk", num_frames=54, seed=3, **fields)
            first = await s.next_media()
            await s.send({"type": "session.playback", "position_seconds": 0.0, "buffered_seconds": 0.5})
            await s.interact("snow", "e1", transition_chunks=2)
            while True:
                message = await s.next(30)
                if message["type"] == "session.metrics":
                    arrivals.append(time.monotonic())
                if message["type"] == "session.done":
                    break
            assert first["kind"] == "media"
            return start, s.t.messages, arrivals

    start, messages, arrivals = run(session(True))
    assert start["config"]["metrics"] is True
    metrics = [i for i, m in enumerate(messages) if m["type"] == "session.metrics"]
    assert len(metrics) >= 2, [m["type"] for m in messages]
    for i in metrics:
        before = messages[i - 1]
        assert before["type"] == "video.chunk_metadata" and before["kind"] == "media"  # right after a pair
        m = messages[i]
        assert m["transport_chunk_index"] == before["transport_chunk_index"]
        assert m["generation_chunk_index"] == before["generation_chunk_index"]
        assert m["realtime_factor"] == before["timing"]["realtime_factor"] and m["realtime_factor"] > 0
        assert m["generate_seconds"] == before["timing"]["generate_seconds"] and 0 <= m["delivery_seconds"] < 5
        assert m["request_id"] == start["request_id"] and m["queued_events"] in (0, 1)
    assert any(messages[i]["buffered_seconds"] is not None for i in metrics[1:])
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    assert all(gap > 0.8 for gap in gaps), gaps  # at most one a second (less the socket's jitter)
    media = [m for m in messages if m["type"] == "video.chunk_metadata" and m["kind"] == "media"]
    assert all(set(m["timing"]) == {"generate_seconds", "encode_seconds", "realtime_factor"} for m in media)

    start, messages, arrivals = run(session(False))
    assert "metrics" not in start["config"] and not arrivals
    assert not [m for m in messages if m["type"] == "session.metrics" or "timing" in m]


def test_metrics_must_be_a_boolean(proxies) -> None:
    async def body() -> dict:
        async with ws(proxies.url(), **NO_KEEPALIVE) as conn:
            s = Ws(conn)
            await s.send({"type": "session.start", "prompt": "x", "metrics": "yes"})
            return await s.next()

    error = run(body())
    assert error["type"] == "error" and error["code"] == "invalid_start" and "metrics" in error["message"]


def test_a_player_that_stands_still_for_three_seconds_is_one_underrun(proxies) -> None:
    """Reports through the real proxy: playing, then the position stands still with nothing
    buffered for 3 s, then it plays on: one underrun of about 3 s on the proxy's /metrics."""
    server = proxies.server(model=PACED_MODEL, start_timeout=9.0)  # a proxy of its own: exact counts

    async def body() -> None:
        async with ws(server.url, **NO_KEEPALIVE) as conn:
            s = Ws(conn)
            await s.start("a lighthouse", seed=5)  # unbounded: stopped below
            await s.next_media()

            async def report(position: float, buffered: float) -> None:
                await s.send({"type": "session.playback", "position_seconds": position, "buffered_seconds": buffered})

            for position in (0.25, 0.5):
                await report(position, 0.4)
                await asyncio.sleep(0.25)
            stalled = time.monotonic()
            while time.monotonic() - stalled < 3.0:  # stands still, empty, every 0.25 s
                await report(0.75, 0.0)
                await asyncio.sleep(0.25)
            await report(0.75, 0.0)
            await asyncio.sleep(0.25)
            await report(1.0, 0.5)  # played 0.25 s since it resumed
            await s.send({"type": "session.stop"})
            await s.until(lambda m: m["type"] == "session.done", 30)

    run(body())
    series = scrape_series(proxy_text(server.port))
    assert series["rtvideo_playback_underruns_total"][frozenset()] == 1
    assert series["rtvideo_playback_underrun_seconds_count"][frozenset()] == 1
    seconds = series["rtvideo_playback_underrun_seconds_sum"][frozenset()]
    print(f"underrun measured: {seconds:.3f} s")
    assert 2.7 <= seconds <= 3.6, seconds
    assert series["rtvideo_delivery_late_chunks_total"][frozenset()] >= 0


def test_the_new_families_are_exported_by_the_proxy_and_the_model(proxies, triton) -> None:
    """The proxy's /metrics has the playback families; Triton's has the per-chunk histograms
    (generation, encoding, realtime factor) and the memory gauges, per model, after a session."""
    server = proxies.server(model=PACED_MODEL, start_timeout=8.5)
    # earlier tests' sessions over and their chunks' metrics flushed: the counts below are this one's
    wait_for_metric(triton, "rtvideo_active_sessions", PACED_MODEL, 0)
    time.sleep(1.5)
    before = scrape_series(urllib.request.urlopen(triton.metrics_url, timeout=10).read().decode())

    async def body() -> None:
        async with ws(server.url, **NO_KEEPALIVE) as conn:
            s = Ws(conn)
            await s.start("a field of wheat", num_frames=18, seed=1)
            await s.until(lambda m: m["type"] == "session.done", 60)

    run(body())
    wait_for_metric(triton, "rtvideo_active_sessions", PACED_MODEL, 0)
    time.sleep(1.5)  # one more flush of the model's buffered metrics
    text = proxy_text(server.port)
    for name in (
        "rtvideo_playback_underruns_total",
        "rtvideo_playback_underrun_seconds_bucket",
        "rtvideo_delivery_late_chunks_total",
        "rtvideo_interaction_to_screen_seconds_bucket",
    ):
        assert f"\n{name}" in text, name
    after = scrape_series(urllib.request.urlopen(triton.metrics_url, timeout=10).read().decode())
    model = ("model", PACED_MODEL)

    def count(series: dict, name: str) -> float:
        return sum(v for labels, v in series.get(name, {}).items() if model in labels)

    for name in (
        "rtvideo_realtime_factor_count",
        "rtvideo_chunk_generate_duration_seconds_count",
        "rtvideo_chunk_encode_duration_seconds_count",
    ):
        assert count(after, name) - count(before, name) == 2, name  # two media chunks
    buckets = {dict(labels)["le"] for labels in after["rtvideo_realtime_factor_bucket"] if model in labels}
    assert "+Inf" in buckets and len(buckets) == 14, buckets
    assert count(after, "rtvideo_generator_memory_bytes") > 50 * 2**20  # the model and its render workers
    assert count(after, "rtvideo_generator_session_memory_bytes") == 0  # no session streams now


def test_record_writes_the_session_metrics_beside_the_video(proxies, triton, tmp_path: Path) -> None:
    """`rtvideo record --metrics` asks for them and writes OUT.metrics.jsonl, one {t, message}
    line per session.metrics; without the flag no such file is written."""
    wait_for_metric(triton, "rtvideo_active_sessions", PACED_MODEL, 0)
    url = proxies.url(model=PACED_MODEL)
    out = tmp_path / "dunes.mp4"
    common = ("--url", url, "--num-frames", "45", "--seed", "2", "--report-playback", "0.25")
    done = run_record("dunes at noon", *common, "-o", str(out), "--metrics")
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in (tmp_path / "dunes.metrics.jsonl").read_text().splitlines()]
    assert len(lines) >= 2, done.stderr
    for line in lines:
        check_server_message(line["message"])
        assert line["message"]["type"] == "session.metrics" and line["t"] > 0
    assert [line["t"] for line in lines] == sorted(line["t"] for line in lines)
    assert "dunes.metrics.jsonl" in done.stderr

    plain = tmp_path / "plain.mp4"
    done = run_record("dunes at noon", *common, "-o", str(plain))
    assert done.returncode == 0, done.stderr
    assert plain.exists() and not (tmp_path / "plain.metrics.jsonl").exists()
