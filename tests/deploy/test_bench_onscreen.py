"""benchmarks/bench_onscreen.py's pure parts: its arguments and how a WebRTC view's frames are
matched to the updates' chunks (the RTP clock's random origin, a skipped chunk, a wrapped
timestamp). Not timed: the benchmark itself prints figures and asserts nothing."""

from __future__ import annotations

import importlib
import math
import sys
from types import ModuleType

import pytest

from tests.support.paths import REPO_ROOT

FPS = 16.0
TICKS = 90_000 // 16  # RTP ticks per frame at 16 fps


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
    try:
        return importlib.import_module("bench_onscreen")
    finally:
        sys.path.remove(str(REPO_ROOT / "benchmarks"))


def test_arguments(bench: ModuleType) -> None:
    args = bench.parse_args([])
    assert args.counts == [1, 8, 16] and args.configs == ["fixed", "playhead"] and args.webrtc
    args = bench.parse_args(["--counts", "2", "--configs", "playhead", "--no-webrtc"])
    assert args.counts == [2] and args.configs == ["playhead"] and not args.webrtc
    for bad in (["--configs", "lazy"], ["--configs", ""], ["--counts", "0"], ["--rounds", "0"], ["--gap", "0"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)
    assert bench.ratio(1.0, 0.5) == 2.0 and math.isnan(bench.ratio(1.0, 0.0))
    assert math.isnan(bench.ratio(float("nan"), 1.0))


def frames(
    origin: int, first_shown: float, chunks: int, per_chunk: int = 9, skip: int | None = None
) -> list[list[float]]:
    """A WebRTC view's presented frames: one every 62.5 ms from `first_shown`, RTP on the clock
    from `origin` (mod 2^32); chunk `skip` (counted from the join) never presented."""
    out = []
    for n in range(chunks * per_chunk):
        if skip is not None and n // per_chunk == skip:
            continue
        out.append([first_shown + n * 62.5, (origin + n * TICKS) % 2**32])
    return out


def test_each_update_is_timed_to_the_first_frame_of_its_chunk(bench: ModuleType) -> None:
    # chunks reach the page every 562.5 ms from t=1000; the view joined at chunk 2 (its first frame
    # shown 30 ms after that chunk arrived); the RTP clock wraps during the view
    chunks = [[1000 + 562.5 * j, 9, [f"u{j}"] if j % 2 else []] for j in range(8)]
    view = {"chunks": chunks, "frames": frames(2**32 - 3 * TICKS, 1000 + 2 * 562.5 + 30, 6), "fps": FPS}
    sent = {"u1": 900.0, "u3": 2000.0, "u5": 3000.0, "u7": 4000.0}
    shown, lags = bench.webrtc_shown(view, sent)
    # u1's chunk came before the view joined: no figure; u3 (chunk 3) shows at chunk 3's arrival + 30
    assert set(shown) == {"u3", "u5", "u7"}
    assert shown["u3"] == pytest.approx(1000 + 3 * 562.5 + 30 - 2000)
    assert shown["u7"] == pytest.approx(1000 + 7 * 562.5 + 30 - 4000)
    assert lags == pytest.approx([30.0] * 6)


def test_a_chunk_the_view_never_presented_gives_its_updates_no_figure(bench: ModuleType) -> None:
    chunks = [[1000 + 562.5 * j, 9, [f"u{j}"]] for j in range(4)]
    view = {"chunks": chunks, "frames": frames(12345, 1040, 4, skip=2), "fps": FPS}
    shown, lags = bench.webrtc_shown(view, {f"u{j}": 500.0 for j in range(4)})
    assert set(shown) == {"u0", "u1", "u3"} and len(lags) == 3
    assert shown["u3"] == pytest.approx(1040 + 3 * 562.5 - 500)


def test_no_frames_no_figures(bench: ModuleType) -> None:
    assert bench.webrtc_shown({"chunks": [[0, 9, ["a"]]], "frames": [], "fps": FPS}, {"a": 0}) == ({}, [])
    summary = bench.summarize_webrtc([{"updates": [{"id": "a", "sent": 0}], "webrtc": {"error": "WHEP 503: full"}}])
    assert summary["shown"] == 0 and summary["updates"] == 1 and summary["errors"] == ["WHEP 503: full"]
    assert math.isnan(summary["p50"])


def test_frames_shown_before_their_chunk_came_are_counted_as_a_misread_join(bench: ModuleType) -> None:
    # chunks 0 and 1 arrive 10 ms apart (a burst), the view's first frame (chunk 0's) is shown
    # after both: the join is read as chunk 1, and chunk 2's frames land before chunk 2 came
    chunks = [[1000.0, 9, []], [1010.0, 9, []], [2000.0, 9, ["u"]], [2562.5, 9, []]]
    view = {"chunks": chunks, "frames": frames(7, 1040.0, 3), "fps": FPS}
    summary = bench.summarize_webrtc([{"updates": [{"id": "u", "sent": 1500.0}], "webrtc": view}])
    assert summary["early"] >= 1
