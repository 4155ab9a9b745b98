"""benchmarks/bench_spectators.py's pure parts: its arguments, the HLS playlist it follows, the
ramp's steps and verdict, and the per-spectator arithmetic. Not timed: the benchmark itself prints
figures and asserts nothing (docs/benchmarks.md)."""

from __future__ import annotations

import importlib
import math
import sys
from types import ModuleType

import pytest

from tests.support.paths import REPO_ROOT


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
    try:
        return importlib.import_module("bench_spectators")
    finally:
        sys.path.remove(str(REPO_ROOT / "benchmarks"))


def test_arguments_default_to_every_transport_and_refuse_nonsense(bench: ModuleType) -> None:
    args = bench.parse_args([])
    assert args.transports == ["watch", "whep", "hls"] and (args.width, args.height) == (256, 256)
    args = bench.parse_args(["--transports", "hls,watch", "--size", "320x192", "--max-spectators", "0"])
    assert args.transports == ["hls", "watch"] and (args.width, args.height) == (320, 192)
    for bad in (
        ["--transports", "rtmp"],
        ["--transports", ""],
        ["--spectators", "0"],
        ["--seconds", "0"],
        ["--realtime", "1.5"],
        ["--size", "big"],
        ["--max-spectators", "-1"],
    ):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)


def test_the_playlist_is_read_by_its_media_sequence_and_its_end(bench: ModuleType) -> None:
    live = (
        "#EXTM3U\n#EXT-X-VERSION:7\n#EXT-X-TARGETDURATION:1\n#EXT-X-MEDIA-SEQUENCE:41\n"
        '#EXT-X-MAP:URI="init.mp4"\n#EXTINF:0.56250,\n41.m4s\n#EXTINF:0.56250,\n42.m4s\n'
    )
    assert bench.parse_playlist(live) == (41, [(41, 0.5625), (42, 0.5625)], False)
    ended = live + "#EXTINF:0.25000,\n43.m4s\n#EXT-X-ENDLIST\n"
    assert bench.parse_playlist(ended) == (41, [(41, 0.5625), (42, 0.5625), (43, 0.25)], True)
    assert bench.parse_playlist("#EXTM3U\n") == (0, [], False)


def test_the_ramp_doubles_to_its_bound_and_holds_the_last_step_that_kept_real_time(bench: ModuleType) -> None:
    assert bench.steps(32) == [1, 2, 4, 8, 16, 32]
    assert bench.steps(12) == [1, 2, 4, 8, 12]
    assert bench.steps(1) == [1] and bench.steps(0) == []
    assert bench.held([(1, 1.0), (2, 0.97), (4, 0.5), (8, 1.0)], 0.9) == (2, True)
    assert bench.held([(1, 0.2)], 0.9) == (0, True)
    assert bench.held([(1, 1.0), (2, 0.95)], 0.9) == (2, False)


def test_a_spectators_cost_is_what_the_proxy_spent_above_its_baseline(bench: ModuleType) -> None:
    before = bench.Usage(at=100.0, cpu=10.0, rss=100 << 20)
    after = bench.Usage(at=120.0, cpu=16.0, rss=108 << 20)
    # 20 s at a baseline of 0.1 CPU s/s is 2 s; 4 s more over 4 spectators and 0.5 min of video
    c = bench.cost(before, after, 100 << 20, 0.1, 4, 30.0, 4_000_000)
    assert c.cpu_per_video_minute == pytest.approx(2.0)
    assert c.rss == pytest.approx(2 << 20)
    assert c.bytes_per_video_minute == pytest.approx(2_000_000)
    assert all(math.isnan(v) for v in bench.cost(before, after, 0, 0.1, 0, 30.0, 1).__dict__.values())
    assert math.isnan(bench.cost(before, after, 0, 0.1, 4, 0.0, 1).cpu_per_video_minute)


def test_a_spectator_keeps_up_within_one_chunk_of_the_owner(bench: ModuleType) -> None:
    chunk = 0.5625
    # the owner got 18 chunks; a WHEP view one chunk behind at the window's end still keeps up
    assert bench.keeping_up([10.125 - chunk, 10.125], 10.125, chunk) == 1.0
    # one that got half keeps half (plus the slack), the slowest decides
    assert bench.keeping_up([10.125, 5.0], 10.125, chunk) == pytest.approx((5.0 + chunk) / 10.125)
    assert bench.keeping_up([], 10.0, chunk) == 0.0 and bench.keeping_up([1.0], 0.0, chunk) == 0.0
