"""The recordings store's index (proxy/recordings/store.py), on a real folder: eviction costs what
it removes, the bound counts disk blocks and recordings, a refused start leaves nothing, and a
token is checked before anything is read."""

from __future__ import annotations

import asyncio
import collections
import json
import socket
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import tornado.httpclient
import tornado.httpserver
import tornado.web

from rtvideo.proxy.edge.recordings_http import routes
from rtvideo.proxy.frames import Frame
from rtvideo.proxy.observability.metrics import ProxyMetrics
from rtvideo.proxy.recordings import ids
from rtvideo.proxy.recordings.backing import BLOCK_BYTES, EVENTS, MANIFEST, VIDEO, LocalBacking, backing_for
from rtvideo.proxy.recordings.recorder import RecordingState, SessionRecorder
from rtvideo.proxy.recordings.service import NoRoom, Recordings
from rtvideo.proxy.recordings.store import TOKEN_DIGEST, Limits, RecordingStore, token_digest
from rtvideo.proxy.settings import ProxySettings

START = {"type": "video.start", "request_id": "video_stream-1", "config": {"model": "realtime_video", "seed": 7}}
TOKEN = "rk1.the-recordings-token"


class Counting(LocalBacking):
    """A folder backing that counts what is asked of it, by method (and manifest reads apart)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.calls: collections.Counter[str] = collections.Counter()
        self.manifest_reads: list[str] = []

    def ids(self) -> list[str]:
        self.calls["ids"] += 1
        return super().ids()

    def read_text(self, rid: str, name: str) -> str | None:
        self.calls["read_text"] += 1
        if name == MANIFEST:
            self.manifest_reads.append(rid)
        return super().read_text(rid, name)

    def stored_bytes(self, rid: str) -> int:
        self.calls["stored_bytes"] += 1
        return super().stored_bytes(rid)

    def remove(self, rid: str) -> None:
        self.calls["remove"] += 1
        super().remove(rid)

    def reset(self) -> None:
        self.calls.clear()
        self.manifest_reads.clear()


def text(message: dict[str, Any]) -> Frame:
    return Frame(json.dumps(message), message)


def pair(index: int, data: bytes) -> Frame:
    meta = {"type": "video.chunk_metadata", "kind": "media", "transport_chunk_index": index, "num_frames": 9}
    return Frame(json.dumps(meta), meta, data)


def left_on_disk(root: Path, count: int, started: float = 1_000.0) -> list[str]:
    """`count` finished recordings as earlier runs leave them (oldest first), made without the store."""
    made = []
    for k in range(count):
        rid = ids.new_id()
        folder = root / rid
        folder.mkdir(parents=True)
        (folder / VIDEO).write_bytes(b"v" * 10)
        (folder / EVENTS).write_text('{"t":0,"dir":"in","message":{"type":"session.start"}}\n')
        manifest = {"recording_id": rid, "status": "complete", "started_at": started + k, "ended_at": started + k}
        (folder / MANIFEST).write_text(json.dumps({**manifest, TOKEN_DIGEST: token_digest(f"{TOKEN}-{k}")}))
        made.append(rid)
    return made


def record_one(store: RecordingStore, frames: list[Frame] | None = None, *, digest: str | None = None) -> str:
    """One session recorded whole through a real recorder and writer thread; its id."""
    writer = ThreadPoolExecutor(max_workers=1)
    r = SessionRecorder(
        store,
        ids.new_id(),
        writer,
        ProxyMetrics(recordings=True),
        received_at=time.monotonic(),
        token_digest=digest,
        until_video_start=True,
    )
    r.received({"type": "session.start", "prompt": "a harbour"}, None)
    for frame in frames if frames is not None else [text(START), pair(0, b"A" * 100)]:
        r.handed_out(frame)
    r.session_ended()
    writer.shutdown(wait=True)
    return r.rid


def disk_bytes(root: Path) -> int:
    """What everything under `root` takes on the disk: allocated blocks, folders included."""
    return sum(p.stat().st_blocks * 512 for p in root.rglob("*"))


def calls_made(fn: Any) -> tuple[Any, int]:
    """What `fn()` returns, and how many Python and built-in calls it made on this thread: the
    work it did, counted, whatever the machine's speed."""
    made = 0

    def count(frame: Any, event: str, arg: Any) -> None:
        nonlocal made
        if event in ("call", "c_call"):
            made += 1

    sys.setprofile(count)
    try:
        result = fn()
    finally:
        sys.setprofile(None)
    return result, made


def test_one_eviction_costs_the_same_at_10_and_at_2000_recordings(tmp_path: Path) -> None:
    """A finished recording past the count evicts the oldest: the backing is asked the same
    things and the store makes the same calls, whatever the number of recordings (no listing,
    no pass over the index)."""
    asked, work = {}, {}
    for count in (10, 2000):
        root = tmp_path / str(count)
        made = left_on_disk(root, count, started=time.time() - 3000)
        backing = Counting(root)
        store = RecordingStore(backing, Limits(max_bytes=10**12, max_age=3600, max_count=count + 1))
        store.index()  # once, at start
        newest = record_one(store)
        assert store.count() == count + 1
        store.limits = Limits(max_bytes=10**12, max_age=3600, max_count=count)
        backing.reset()
        removed, work[count] = calls_made(lambda store=store: store.evict())
        asked[count] = dict(backing.calls)
        assert removed == [made[0]] and not (root / made[0]).exists()  # the oldest went, only it
        assert (root / made[1]).exists() and (root / newest / MANIFEST).exists() and store.count() == count
    assert asked[10] == asked[2000] and asked[10].get("ids", 0) == 0, asked
    assert work[2000] < work[10] + 100, work  # a pass over the index would make thousands more


def test_the_bound_counts_blocks_on_the_disk_not_bytes_written(tmp_path: Path) -> None:
    """Tiny recordings: a few hundred bytes each, a few blocks each on the disk. The store counts
    at least what the disk holds, and keeps the folder within its bound in blocks."""
    root = tmp_path / "rec"
    store = RecordingStore(LocalBacking(root), Limits(max_bytes=10**12, max_age=0))
    made = [record_one(store) for _ in range(20)]
    content = sum(f.stat().st_size for f in root.rglob("*") if f.is_file())
    assert store.total_bytes() >= disk_bytes(root) > 4 * content  # blocks, not what was written
    one = store.total_bytes() // len(made)
    store.limits = Limits(max_bytes=5 * one, max_age=0)
    for _ in range(10):
        record_one(store)
    assert disk_bytes(root) <= store.total_bytes() <= 5 * one
    assert len(list(root.iterdir())) == 5 and not any((root / rid).exists() for rid in made)


def test_the_number_of_recordings_is_bounded_finished_and_live(tmp_path: Path) -> None:
    store = RecordingStore(
        LocalBacking(tmp_path), Limits(max_bytes=10**12, max_age=0, per_recording=10**9, max_count=3)
    )
    made = [record_one(store) for _ in range(5)]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(made[2:])  # the newest three
    recordings = Recordings(store, record_all=False, metrics=ProxyMetrics(recordings=True))
    try:
        live = []
        for _ in range(3):
            recorder, _token = recordings.begin(received_at=time.monotonic())
            recorder.received({"type": "session.start", "prompt": "a harbour"}, None)
            recorder.handed_out(text(START))  # live: it began in the store
            live.append(recorder)
        with pytest.raises(NoRoom, match="recordings-max-count 3"):
            recordings.begin(received_at=time.monotonic())  # three live ones fill the count
        for recorder in live:
            recorder.session_ended()
    finally:
        recordings.close()
    assert len(list(tmp_path.iterdir())) == 3 and not any((tmp_path / rid).exists() for rid in made)


def test_a_start_refused_before_video_start_leaves_nothing(tmp_path: Path) -> None:
    store = RecordingStore(LocalBacking(tmp_path), Limits(max_bytes=10**12, max_age=0, max_count=1))
    recordings = Recordings(store, record_all=False, metrics=ProxyMetrics(recordings=True))
    try:
        recorder, _ = recordings.begin(received_at=time.monotonic())
        recorder.received({"type": "session.start", "prompt": "a harbour"}, None)
        recorder.handed_out(text({"type": "error", "code": "invalid_start", "message": "no"}))
        recorder.handed_out(text({"type": "session.done", "chunks": 0}))
        recorder.session_ended()
    finally:
        recordings.close()
    assert recorder.state is RecordingState.NOT_BEGUN and list(tmp_path.iterdir()) == []
    assert store.count() == 0 and store.reserve()  # its place was given back


def test_a_wrong_token_reads_nothing_and_is_answered_as_an_unknown_id(tmp_path: Path) -> None:
    backing = Counting(tmp_path)
    store = RecordingStore(backing, Limits(max_bytes=10**12, max_age=0))
    rid = record_one(store, digest=token_digest(TOKEN))
    unknown = ids.new_id()
    backing.reset()
    assert store.authorised(rid, "rk1.another-token") is None
    assert store.authorised(unknown, "rk1.another-token") is None
    assert backing.manifest_reads == []  # nothing of the recording was read for a wrong token
    assert store.authorised(rid, TOKEN) is not None and backing.manifest_reads == [rid]  # read once it opens

    recordings = Recordings(store, record_all=False, metrics=ProxyMetrics(recordings=True))
    try:
        answers = asyncio.run(_http_answers(recordings, [(rid, "rk1.another-token"), (unknown, "rk1.another-token")]))
    finally:
        recordings.close()
    (known_status, known_body), (unknown_status, unknown_body) = answers
    assert known_status == unknown_status == 404
    assert known_body.replace(rid, "ID") == unknown_body.replace(unknown, "ID")


def test_a_recording_another_replica_finished_is_found_by_its_token(tmp_path: Path) -> None:
    """Two stores on one folder: what one finished after the other indexed opens at the other."""
    here = RecordingStore(LocalBacking(tmp_path), Limits(max_bytes=10**12, max_age=0))
    here.index()
    there = RecordingStore(LocalBacking(tmp_path), Limits(max_bytes=10**12, max_age=0))
    rid = record_one(there, digest=token_digest(TOKEN))
    assert here.authorised(rid, "rk1.another-token") is None
    manifest = here.authorised(rid, TOKEN)
    assert manifest is not None and manifest["recording_id"] == rid


async def _http_answers(recordings: Recordings, asks: list[tuple[str, str]]) -> list[tuple[int, str]]:
    """(status, body) of GET /v1/recordings/{id}?recording_token=... for each ask, from a real
    Tornado server on a free port."""
    settings = ProxySettings()
    app = tornado.web.Application(routes(recordings, settings))
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.setblocking(False)
    server = tornado.httpserver.HTTPServer(app)
    server.add_sockets([listener])
    port = listener.getsockname()[1]
    client = tornado.httpclient.AsyncHTTPClient()
    out = []
    try:
        for rid, token in asks:
            url = f"http://127.0.0.1:{port}/v1/recordings/{rid}?recording_token={token}"
            reply = await client.fetch(url, raise_error=False, request_timeout=30)
            out.append((reply.code, reply.body.decode()))
    finally:
        server.stop()
        await server.close_all_connections()
    return out


def test_block_accounting_of_an_object_store_rounds_each_object_up() -> None:
    store = RecordingStore(backing_for(f"memory://rtvideo-blocks-{ids.new_id()}"), Limits(max_bytes=10**12, max_age=0))
    record_one(store)
    assert store.total_bytes() == 3 * BLOCK_BYTES  # video, event log, manifest: a block each


def test_an_object_store_is_evicted_by_its_index_too() -> None:
    store = RecordingStore(backing_for(f"memory://rtvideo-count-{ids.new_id()}"), Limits(max_bytes=10**12, max_age=0))
    made = [record_one(store, digest=token_digest(TOKEN)) for _ in range(4)]
    store.limits = Limits(max_bytes=10**12, max_age=0, max_count=2)
    assert store.evict() == made[:2]  # the oldest two, by the index
    assert sorted(store.backing.ids()) == sorted(made[2:]) and store.count() == 2
    assert store.authorised(made[0], TOKEN) is None and store.authorised(made[3], TOKEN) is not None
