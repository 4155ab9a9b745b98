"""Recordings (proxy/recordings): ids, the store's bounds, and a recorder writing off the loop."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from rtvideo.proxy.frames import Frame
from rtvideo.proxy.observability.metrics import ProxyMetrics
from rtvideo.proxy.recordings import ids, recorder
from rtvideo.proxy.recordings.backing import BLOCK_BYTES, LocalBacking, backing_for
from rtvideo.proxy.recordings.recorder import RecordingState, SessionRecorder
from rtvideo.proxy.recordings.store import LEFTOVER_QUIET_SECONDS, Limits, RecordingStore
from tests.support.probes import room_for_new

START = {
    "type": "video.start",
    "request_id": "video_stream-1",
    "config": {"model": "realtime_video", "seed": 7, "fps": 16},
    "resume_token": "secret-resume",
    "watch_token": "secret-watch",
}


def text(message: dict[str, Any]) -> Frame:
    return Frame(json.dumps(message), message)


def pair(kind: str, index: int | None, frames: int, data: bytes) -> Frame:
    meta = {"type": "video.chunk_metadata", "kind": kind, "transport_chunk_index": index, "num_frames": frames}
    return Frame(json.dumps(meta), meta, data)


def record(store: RecordingStore, frames: list[Frame], registry: CollectorRegistry | None = None) -> SessionRecorder:
    writer = ThreadPoolExecutor(max_workers=1)
    r = SessionRecorder(
        store, ids.new_id(), writer, ProxyMetrics(registry, recordings=True), received_at=time.monotonic()
    )
    r.received({"type": "session.start", "prompt": "a harbour"}, None)
    for frame in frames:
        r.handed_out(frame)
    r.received({"type": "session.stop"}, None)
    r.session_ended()
    writer.shutdown(wait=True)
    return r


def stream() -> list[Frame]:
    return [
        text(START),
        pair("init", None, 0, b"INIT"),
        pair("media", 0, 9, b"AAAA"),
        text({"type": "session.interaction.queued", "event_id": "e1"}),
        pair("media", 1, 9, b"BBBB"),
        pair("trailer", None, 0, b"END"),
        text({"type": "session.done", "chunks": 2, "stopped": True, "unapplied_event_ids": []}),
    ]


def test_a_recording_is_the_stream_as_sent_its_event_log_and_a_manifest(tmp_path: Path) -> None:
    store = RecordingStore(LocalBacking(tmp_path), Limits(max_bytes=10**9, max_age=0))
    r = record(store, stream())
    folder = tmp_path / r.rid
    assert (folder / "video.mp4").read_bytes() == b"INITAAAABBBBEND"
    lines = [json.loads(line) for line in (folder / "events.jsonl").read_text().splitlines()]
    assert [(e["dir"], e["message"]["type"]) for e in lines] == [
        ("in", "session.start"),
        ("out", "video.start"),
        ("out", "video.chunk_metadata"),
        ("out", "video.chunk_metadata"),
        ("out", "session.interaction.queued"),
        ("out", "video.chunk_metadata"),
        ("out", "video.chunk_metadata"),
        ("out", "session.done"),
        ("in", "session.stop"),
    ]
    assert lines[0]["participant"] == "owner" and all(e["t"] >= 0 for e in lines)
    assert [e["t"] for e in lines] == sorted(e["t"] for e in lines)
    assert "secret" not in (folder / "events.jsonl").read_text()  # a token is a key: never recorded
    manifest = store.manifest(r.rid)
    assert manifest is not None and manifest["status"] == "complete"
    assert (manifest["request_id"], manifest["config"]["seed"], manifest["chunks"], manifest["frames"]) == (
        "video_stream-1",
        7,
        2,
        18,
    )
    assert manifest["ended"] == {"chunks": 2, "stopped": True}
    assert manifest["bytes"] == 15 + (folder / "events.jsonl").stat().st_size


def test_an_fsspec_store_spools_locally_and_uploads_at_the_end() -> None:
    store = RecordingStore(backing_for("memory://rtvideo-test-recordings"), Limits(max_bytes=10**9, max_age=0))
    r = record(store, stream())
    opened = store.open(r.rid, "video.mp4")
    assert opened is not None and opened[0].read() == b"INITAAAABBBBEND"
    assert [m["recording_id"] for m in store.manifests()] == [r.rid]
    assert store.delete(r.rid) and store.manifest(r.rid) is None


@pytest.mark.parametrize("bad", ["../etc", "..", "a" * 31, "A" * 32, "0" * 32 + "/x", "", None, 5])
def test_a_malformed_id_never_reaches_a_path(tmp_path: Path, bad: object) -> None:
    store = RecordingStore(LocalBacking(tmp_path), Limits(max_bytes=10**9, max_age=0))
    with pytest.raises(ids.MalformedId):
        store.manifest(bad)  # type: ignore[arg-type]
    with pytest.raises(ids.MalformedId):
        store.delete(bad)  # type: ignore[arg-type]


def disk_bytes(root: Path) -> int:
    """What the folders and files under `root` take on the disk: their allocated blocks."""
    return sum(p.stat().st_blocks * 512 for p in root.rglob("*"))


def folder_bytes(root: Path) -> int:
    """What the store counts for what is under `root`: each folder and file's blocks, at least one."""
    return sum(max(BLOCK_BYTES, p.stat().st_blocks * 512) for p in root.rglob("*"))


def test_the_oldest_go_first_and_the_old_go_by_age(tmp_path: Path) -> None:
    store = RecordingStore(LocalBacking(tmp_path), Limits(max_bytes=10**9, max_age=0))
    made = [record(store, stream()).rid for _ in range(3)]
    assert store.total_bytes() == folder_bytes(tmp_path)  # everything written is counted, manifests too
    sizes = [folder_bytes(tmp_path / rid) + BLOCK_BYTES for rid in made]  # its folder's block too
    store.limits = Limits(max_bytes=sizes[1] + sizes[2], max_age=0)
    assert store.evict() == [made[0]]
    assert {m["recording_id"] for m in store.manifests()} == set(made[1:])
    store.limits = Limits(max_bytes=10**9, max_age=60)
    assert sorted(store.evict(now=time.time() + 120)) == sorted(made[1:])


def test_a_store_that_fails_drops_the_recording_not_the_session(tmp_path: Path) -> None:
    class FullDisk(LocalBacking):
        def spool_for(self, rid: str) -> Path:
            folder = super().spool_for(rid)
            (folder / "video.mp4").mkdir()  # opening it for writing fails, as a full disk's write would
            return folder

    registry = CollectorRegistry()
    store = RecordingStore(FullDisk(tmp_path), Limits(max_bytes=10**9, max_age=0))
    r = record(store, stream(), registry)  # no exception reaches the caller (the session)
    assert r.state is RecordingState.FAILED
    manifest = store.manifest(r.rid)
    assert manifest is not None and manifest["status"] == "failed" and "write failed" in manifest["reason"]
    assert store.open(r.rid, "events.jsonl") is None
    value = registry.get_sample_value("rtvideo_recording_failures_total", {"reason": "write failed"})
    assert value == 1.0


def test_a_slow_store_drops_the_recording_at_its_pending_bound(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr(recorder, "MAX_PENDING_BYTES", 100)
    store = RecordingStore(LocalBacking(tmp_path), Limits(max_bytes=10**9, max_age=0))
    blocked = ThreadPoolExecutor(max_workers=1)
    gate = blocked.submit(time.sleep, 0.5)  # the writer is busy: nothing queued is written yet
    r = SessionRecorder(store, ids.new_id(), blocked, ProxyMetrics(recordings=True), received_at=time.monotonic())
    r.handed_out(pair("media", 0, 9, b"x" * 200))
    assert r.state is RecordingState.FAILED  # decided on the loop, at once
    gate.result()
    blocked.shutdown(wait=True)
    assert store.manifest(r.rid)["status"] == "failed"  # type: ignore[index]


def test_a_recording_at_its_cap_is_truncated_at_a_whole_chunk_and_kept(tmp_path: Path) -> None:
    """The cap counts blocks: a folder, the marker, the event log and a video of up to 4 KiB
    take 16 KiB; the second 3,000-byte payload would take the video to a second block."""
    a, b = b"A" * 3000, b"B" * 3000
    frames = [text(START), pair("init", None, 0, b"INIT"), pair("media", 0, 9, a), pair("media", 1, 9, b)]
    store = RecordingStore(LocalBacking(tmp_path), Limits(max_bytes=10**9, max_age=0, per_recording=4 * BLOCK_BYTES))
    r = record(store, frames)
    assert r.state is RecordingState.TRUNCATED
    manifest = store.manifest(r.rid)
    assert manifest is not None and manifest["status"] == "truncated" and "its cap" in manifest["reason"]
    video = (tmp_path / r.rid / "video.mp4").read_bytes()
    assert video == b"INIT" + a  # payloads whole, in order, up to the cap
    data = (tmp_path / r.rid / "events.jsonl").stat().st_size + len(video)
    assert data == manifest["bytes"]


def test_live_recordings_never_take_the_store_past_its_bound(tmp_path: Path) -> None:
    """Three recordings written at once in a store that holds two at their cap: the oldest
    finished one is evicted first; what no eviction can make room for is truncated."""
    one = folder_bytes_of_one(tmp_path / "probe")
    store = RecordingStore(LocalBacking(tmp_path / "rec"), Limits(max_bytes=2 * one, max_age=0, per_recording=one))
    first = record(store, stream())
    assert first.state is RecordingState.COMPLETE and room_for_new(store)
    writer = ThreadPoolExecutor(max_workers=1)
    live = [
        SessionRecorder(store, ids.new_id(), writer, ProxyMetrics(recordings=True), received_at=0.0) for _ in range(2)
    ]
    for frame in stream()[:-1]:
        for r in live:
            r.handed_out(frame)
    writer.shutdown(wait=True)
    assert store.manifest(first.rid) is None  # the finished one went first
    assert folder_bytes(tmp_path / "rec") <= 2 * one
    assert not room_for_new(store)  # the live ones leave no room for a third at its cap


def folder_bytes_of_one(root: Path) -> int:
    probe = RecordingStore(LocalBacking(root), Limits(max_bytes=10**9, max_age=0))
    record(probe, stream())
    return folder_bytes(root)


def test_files_and_folders_are_the_proxy_users_alone(tmp_path: Path) -> None:
    store = RecordingStore(LocalBacking(tmp_path / "rec"), Limits(max_bytes=10**9, max_age=0))
    r = record(store, stream())
    assert (tmp_path / "rec").stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "rec" / r.rid).stat().st_mode & 0o777 == 0o700
    modes = {f.name: f.stat().st_mode & 0o777 for f in (tmp_path / "rec" / r.rid).iterdir()}
    assert modes == {"video.mp4": 0o600, "events.jsonl": 0o600, "manifest.json": 0o600}


def test_only_what_a_replay_reads_is_logged(tmp_path: Path) -> None:
    store = RecordingStore(LocalBacking(tmp_path), Limits(max_bytes=10**9, max_age=0))
    writer = ThreadPoolExecutor(max_workers=1)
    r = SessionRecorder(store, ids.new_id(), writer, ProxyMetrics(recordings=True), received_at=time.monotonic())
    padding = "x" * 100_000
    r.received({"type": "session.start", "prompt": "a harbour"}, None)
    r.received({"type": "session.ping", "padding": padding}, None)
    r.received({"type": "session.playback", "position_seconds": 1.0, "padding": padding}, None)
    r.received({"type": "session.interaction", "interaction": {"event_id": "e"}, "padding": padding}, None)
    r.handed_out(text({"type": "session.pong", "padding": padding}))
    r.session_ended()
    writer.shutdown(wait=True)
    log = (tmp_path / r.rid / "events.jsonl").read_text()
    assert "padding" not in log and len(log) < 1000
    kinds = [json.loads(line)["message"]["type"] for line in log.splitlines()]
    assert kinds == ["session.start", "session.interaction"]


def test_a_folder_left_by_a_killed_proxy_is_closed_as_incomplete(tmp_path: Path) -> None:
    rid = ids.new_id()
    (tmp_path / rid).mkdir()
    (tmp_path / rid / "video.mp4").write_bytes(b"12345")
    store = RecordingStore(LocalBacking(tmp_path), Limits(max_bytes=10**9, max_age=0))
    assert store.close_leftovers() == []  # written a moment ago: it may be another proxy's, just begun
    assert store.close_leftovers(now=time.time() + LEFTOVER_QUIET_SECONDS + 1) == [rid]
    assert store.manifest(rid) == {"recording_id": rid, "status": "incomplete", "bytes": 5, "started_at": 0.0}
