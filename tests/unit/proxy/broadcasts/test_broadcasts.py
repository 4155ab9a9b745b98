"""Broadcasts (proxy/broadcasts): the playlist, the writer's window and end, a takeover's going
on, the sweep, the settings. The stream through real Triton and ffmpeg: tests/e2e/test_broadcasts.py."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path
from typing import Any

import pytest

from rtvideo.proxy.broadcasts import playlist
from rtvideo.proxy.broadcasts.playlist import Segment
from rtvideo.proxy.broadcasts.service import PREFIX, Broadcasts, NoBroadcastRoom
from rtvideo.proxy.broadcasts.writer import BroadcastState, Limits
from rtvideo.proxy.frames import Frame
from rtvideo.proxy.recordings import ids
from rtvideo.proxy.recordings.backing import backing_for
from rtvideo.proxy.settings import ProxySettings
from rtvideo.redaction import CAPABILITY_PATHS, redact_path
from tests.support.probes import next_sequence

START = {"type": "video.start", "request_id": "video_stream-1", "config": {"fps": 16}}


def box(kind: bytes, body: bytes = b"") -> bytes:
    return struct.pack(">I4s", 8 + len(body), kind) + body


INIT = box(b"ftyp", b"iso6") + box(b"moov", b"x" * 20)


def chunk(index: int, body: bytes, frames: int = 8) -> Frame:
    meta = {"type": "video.chunk_metadata", "kind": "media", "transport_chunk_index": index, "num_frames": frames}
    return Frame(json.dumps(meta), meta, body)


def body(n: int) -> bytes:
    return box(b"moof", bytes([n]) * 8) + box(b"mdat", bytes([n]) * 100)


def broadcasts(location: str, window: int = 3, max_bytes: int = 1 << 20, **kw: Any) -> Broadcasts:
    return Broadcasts(backing_for(location), Limits(window=window, max_bytes=max_bytes), **kw)


def play(b: Broadcasts, chunks: int, start_index: int = 0) -> Any:
    writer = b.begin()
    writer.handed_out(Frame(json.dumps(START), START))
    for i in range(start_index, start_index + chunks):
        writer.handed_out(chunk(i, (INIT if i == start_index else b"") + body(i)))
    return writer


def flush(b: Broadcasts) -> None:
    b.flush(10)


def test_the_playlist_is_cmaf_hls_and_reads_back() -> None:
    segments = [Segment(5, 0.5625), Segment(6, 0.5625)]
    text = playlist.render(segments, ended=True, target=1)
    assert text.splitlines()[:6] == [
        "#EXTM3U",
        "#EXT-X-VERSION:7",
        "#EXT-X-TARGETDURATION:1",
        "#EXT-X-MEDIA-SEQUENCE:5",
        "#EXT-X-INDEPENDENT-SEGMENTS",
        '#EXT-X-MAP:URI="init.mp4"',
    ]
    assert text.rstrip().endswith("#EXT-X-ENDLIST") and "5.m4s" in text
    listing = playlist.parse(text)
    assert listing.ended and next_sequence(listing) == 7 and [s.sequence for s in listing.segments] == [5, 6]
    assert playlist.target_duration([Segment(0, 2.4)], at_least=1) == 3
    with pytest.raises(ValueError):
        playlist.parse("#EXTM3U\n#EXTINF:1,\n../etc/passwd\n")


def test_a_window_slides_and_old_segments_leave_the_store() -> None:
    location = f"memory://rtvideo-broadcast-{ids.new_id()}"
    b = broadcasts(location, window=3)
    try:
        writer = play(b, 10)
        flush(b)
        store = b.backing
        text = store.read_text(writer.bid, playlist.PLAYLIST)
        assert text is not None
        listing = playlist.parse(text)
        assert [s.sequence for s in listing.segments] == [7, 8, 9] and not listing.ended
        assert "#EXT-X-MEDIA-SEQUENCE:7" in text and "#EXTINF:0.50000,chunk=9" in text
        assert store.open(writer.bid, playlist.INIT) is not None
        kept = sorted(int(n.removesuffix(".m4s")) for n in names(b, writer.bid) if n.endswith(".m4s"))
        assert kept == [4, 5, 6, 7, 8, 9]  # the window, and as many more for late readers
        assert writer.end() and not writer.end()  # once
        flush(b)
        ended = store.read_text(writer.bid, playlist.PLAYLIST)
        assert ended is not None and ended.rstrip().endswith("#EXT-X-ENDLIST")
        writer.handed_out(chunk(10, body(10)))  # after the end: nothing more
        flush(b)
        assert store.read_text(writer.bid, playlist.PLAYLIST) == ended
        assert b.live == 0
    finally:
        b.close()


def names(b: Broadcasts, bid: str) -> list[str]:
    backing: Any = b.backing
    return [str(p).rsplit("/", 1)[-1] for p in backing.fs.ls(f"{backing.prefix.rstrip('/')}/{bid}", detail=False)]


def test_the_bytes_bound_shortens_the_window() -> None:
    b = broadcasts(f"memory://rtvideo-broadcast-{ids.new_id()}", window=30, max_bytes=4 * len(body(0)))
    try:
        writer = play(b, 12)
        flush(b)
        listing = playlist.parse(b.backing.read_text(writer.bid, playlist.PLAYLIST) or "")
        assert len(listing.segments) == 2 and listing.segments[-1].sequence == 11
        assert len([n for n in names(b, writer.bid) if n.endswith(".m4s")]) == 4
    finally:
        b.close()


def test_a_takeover_goes_on_with_the_sequence_and_writes_what_it_lacks() -> None:
    location = f"memory://rtvideo-broadcast-{ids.new_id()}"
    first = broadcasts(location, window=5)
    try:
        writer = play(first, 4)  # chunks 0..3
        flush(first)
        writer.let_go()
        assert writer.state is BroadcastState.LET_GO
    finally:
        first.close()
    text = first.backing.read_text(writer.bid, playlist.PLAYLIST) or ""
    assert "#EXT-X-ENDLIST" not in text  # let go: the next holder goes on
    second = broadcasts(location, window=5)
    try:
        earlier = [(3, 8, body(3)), (4, 8, body(4)), (5, 8, body(5))]  # the session store's last chunks
        again = second.resume(writer.bid, INIT, earlier, 16.0)
        assert again.url == writer.url
        again.handed_out(chunk(5, body(5)))  # handed out again after the takeover: not written twice
        again.handed_out(chunk(6, body(6)))
        again.end()
        flush(second)
        listing = playlist.parse(second.backing.read_text(writer.bid, playlist.PLAYLIST) or "")
        assert [s.sequence for s in listing.segments] == [2, 3, 4, 5, 6] and listing.ended
        assert second.backing.open(writer.bid, "6.m4s") is not None
        f, _ = second.backing.open(writer.bid, "4.m4s") or (None, 0)
        assert f is not None and f.read() == body(4)  # chunk 4 is segment 4: none twice, none lost
    finally:
        second.close()


def test_an_ended_broadcast_stays_ended_after_a_takeover() -> None:
    location = f"memory://rtvideo-broadcast-{ids.new_id()}"
    b = broadcasts(location)
    try:
        writer = play(b, 2)
        writer.end()
        flush(b)
        again = b.resume(writer.bid, INIT, [(2, 8, body(2))], 16.0)
        again.handed_out(chunk(3, body(3)))
        flush(b)
        assert json.loads(b.backing.read_text(writer.bid, playlist.MARKER) or "{}")["ended_at"]  # still swept as ended
        assert [
            s.sequence for s in playlist.parse(b.backing.read_text(writer.bid, playlist.PLAYLIST) or "").segments
        ] == [0, 1]
    finally:
        b.close()


def test_the_sweep_removes_ended_broadcasts_after_their_retention_and_never_a_live_one(tmp_path: Path) -> None:
    b = broadcasts(str(tmp_path / "bc"), retention=60.0)
    try:
        ended, live = play(b, 2), play(b, 2)
        ended.end()
        flush(b)
        assert b.sweep() == 0  # within the retention
        assert b.sweep(now=time.time() + 61) == 1
        assert sorted(p.name for p in (tmp_path / "bc").iterdir()) == [live.bid]
        assert b.sweep(now=time.time() + 10**6) == 0  # live here: never
        live.let_go()  # and once no proxy renews it, it is an orphan
        assert b.sweep(now=time.time() + 10**6) == 1 and not list((tmp_path / "bc").iterdir())
    finally:
        b.close()


def test_a_start_refused_before_video_start_leaves_nothing(tmp_path: Path) -> None:
    b = broadcasts(str(tmp_path / "bc"), max_live=1)
    try:
        writer = b.begin()
        with pytest.raises(NoBroadcastRoom):
            b.begin()
        writer.session_ended()
        flush(b)
        assert not list((tmp_path / "bc").iterdir()) and b.live == 0
    finally:
        b.close()


def test_urls_settings_and_the_masked_id() -> None:
    b = broadcasts("memory://rtvideo-broadcast-urls", base_url="https://cdn.example/live/")
    try:
        assert b.url("a" * 32) == f"https://cdn.example/live/{'a' * 32}/index.m3u8" and b.folder is None
    finally:
        b.close()
    assert redact_path(f"/v1/broadcasts/{'a' * 32}/index.m3u8") == "/v1/broadcasts/***/index.m3u8"
    assert PREFIX in CAPABILITY_PATHS  # the access log masks the id in every broadcast path
    with pytest.raises(ValueError, match="broadcast-store"):
        ProxySettings(broadcast_base_url="https://cdn.example/live")
    with pytest.raises(ValueError, match="broadcast-base-url"):
        ProxySettings(broadcast_store="/tmp/x", broadcast_base_url="javascript:alert(1)")
    assert Broadcasts.create(ProxySettings()) is None


class FullDisk:
    """A backing whose every write fails (a full disk, an unreachable bucket)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def write_bytes(self, bid: str, name: str, data: bytes) -> None:
        raise OSError(28, "No space left on device")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_a_failing_store_stops_the_broadcast_never_the_caller(tmp_path: Path) -> None:
    from prometheus_client import CollectorRegistry

    from rtvideo.proxy.observability.metrics import ProxyMetrics, value

    metrics = ProxyMetrics(CollectorRegistry())
    b = Broadcasts(FullDisk(backing_for(str(tmp_path / "bc"))), Limits(window=3, max_bytes=1 << 20), metrics=metrics)
    try:
        writer = play(b, 5)  # every write fails on the writer thread; handed_out never raises
        writer.end()
        flush(b)
        assert value(metrics.broadcast_failures) == 1  # once: later writes are skipped
        assert value(metrics.broadcast_segments) == 0 and value(metrics.broadcasts_live) == 0
    finally:
        b.close()


def test_a_stuck_store_ends_the_broadcast_with_bounded_queue(tmp_path: Path) -> None:
    import threading

    gate = threading.Event()

    class Stuck(FullDisk):
        def write_bytes(self, bid: str, name: str, data: bytes) -> None:
            gate.wait(30)

    b = Broadcasts(Stuck(backing_for(str(tmp_path / "bc"))), Limits(window=3, max_bytes=1 << 20))
    try:
        writer = play(b, 200)  # the writer thread is stuck on the first write
        assert writer.state is BroadcastState.FAILED and b.live == 0
    finally:
        gate.set()
        b.close()
