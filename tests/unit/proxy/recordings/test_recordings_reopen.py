"""A recording taken over with its session (proxy/recordings/reopen.py; docs/recordings.md
"Recordings across replicas"): two recording stores on one folder stand for two proxies; the
session store's log is built as `SavedSession.read` gives it. A killed holder's torn last
write is cut back to whole records, what it had not written is written from the session
store, and the recording goes on under the same id, its video one stream of whole payloads."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from rtvideo.proxy.continuity.record import SavedEvent, SavedFrame
from rtvideo.proxy.frames import Frame
from rtvideo.proxy.observability.metrics import ProxyMetrics
from rtvideo.proxy.recordings import ids
from rtvideo.proxy.recordings.backing import LIVE, MANIFEST, backing_for
from rtvideo.proxy.recordings.recorder import RecordingState, SessionRecorder, Takeover
from rtvideo.proxy.recordings.store import LEFTOVER_QUIET_SECONDS, TOKEN_DIGEST, Limits, RecordingStore, token_digest

DIGEST = token_digest("rk1.the-recording")
START = {"type": "video.start", "request_id": "video_stream-9", "config": {"model": "m", "seed": 3, "fps": 16}}
LIMITS = Limits(max_bytes=10**9, max_age=0)


def payload(index: int) -> bytes:
    return bytes([65 + index]) * (100 + index)  # each chunk's bytes differ, and so do their sizes


def chunk(index: int) -> Frame:
    data = payload(index)
    meta = {
        "type": "video.chunk_metadata",
        "kind": "media",
        "transport_chunk_index": index,
        "generation_chunk_index": index,
        "num_frames": 9,
        "byte_length": len(data),
    }
    return Frame(json.dumps(meta), meta, data)


def ack(event_id: str) -> Frame:
    message = {"type": "session.interaction.queued", "event_id": event_id}
    return Frame(json.dumps(message), message)


def interaction(event_id: str, prompt: str) -> dict[str, Any]:
    return {"type": "session.interaction", "interaction": {"event_id": event_id, "event": {"prompt": prompt}}}


def saved(frames: list[Frame | dict[str, Any]], kept_from: int = 0) -> list[SavedEvent | SavedFrame]:
    """The session store's log of what the owner was handed (and the interactions forwarded),
    with the payloads of the pairs from `kept_from` on (the store forgets older ones)."""
    out: list[SavedEvent | SavedFrame] = []
    for item in frames:
        if isinstance(item, dict):
            out.append(SavedEvent(json.dumps(item).encode()))
            continue
        if item.message["type"] == "video.start":
            continue  # kept as a field, not in the log
        index = item.message.get("transport_chunk_index")
        data = item.data if isinstance(index, int) and index >= kept_from else None
        out.append(SavedFrame(item.text, item.message, index, data))
    return out


class Proxy:
    """One proxy's side: its store on the shared folder, its writer and waiter threads."""

    def __init__(self, root: str) -> None:
        self.store = RecordingStore(backing_for(root), LIMITS)
        self.registry = CollectorRegistry()
        self.metrics = ProxyMetrics(self.registry, recordings=True)
        self.writer = ThreadPoolExecutor(max_workers=1)
        self.waiter = ThreadPoolExecutor(max_workers=1)

    def begin(self, rid: str) -> SessionRecorder:
        r = SessionRecorder(
            self.store, rid, self.writer, self.metrics, received_at=time.monotonic(), token_digest=DIGEST
        )
        r.received({"type": "session.start", "prompt": "a harbour"}, None)
        return r

    def reopen(self, rid: str, log: list[SavedEvent | SavedFrame], *, holder_gone: bool = True) -> SessionRecorder:
        takeover = Takeover(tuple(log), holder_gone, self.waiter)
        return SessionRecorder(
            self.store,
            rid,
            self.writer,
            self.metrics,
            received_at=time.monotonic(),
            token_digest=DIGEST,
            takeover=takeover,
        )

    def settle(self) -> None:
        self.waiter.shutdown(wait=True)
        self.writer.shutdown(wait=True)

    def not_continued(self) -> float | None:
        return self.registry.get_sample_value("rtvideo_recording_failures_total", {"reason": "not continued"})


@pytest.fixture
def proxies(tmp_path: Path) -> Iterator[tuple[Proxy, Proxy]]:
    pair = (Proxy(str(tmp_path)), Proxy(str(tmp_path)))
    yield pair
    for proxy in pair:
        proxy.settle()


def killed(proxy: Proxy, frames: list[Frame]) -> str:
    """A recording whose proxy was killed after writing `frames` (no manifest: it never ended)."""
    rid = ids.new_id()
    r = proxy.begin(rid)
    for frame in frames:
        r.handed_out(frame)
    proxy.writer.shutdown(wait=True)  # what was queued is written; then the process is gone
    return rid


def lines(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (folder / "events.jsonl").read_text().splitlines()]


def owner_out(folder: Path) -> list[dict[str, Any]]:
    return [e["message"] for e in lines(folder) if e["dir"] == "out" and "participant" not in e]


def test_a_torn_last_write_is_cut_back_and_the_recording_goes_on(tmp_path: Path, proxies: tuple[Proxy, Proxy]) -> None:
    a, b = proxies
    handed = [Frame(json.dumps(START), START), chunk(0), ack("e1"), chunk(1), chunk(2)]
    rid = killed(a, handed[:4])
    folder = tmp_path / rid
    started = json.loads((folder / LIVE).read_text())["started_at"]
    whole = (folder / "video.mp4").read_bytes()
    assert whole == payload(0) + payload(1) and not (folder / MANIFEST).exists()
    # the kill tore chunk 2's write: its line whole, half its payload, then half of a next line
    with (folder / "events.jsonl").open("ab") as f:
        f.write(json.dumps({"t": 9.0, "dir": "out", "message": chunk(2).message}).encode() + b"\n")
        f.write(b'{"t": 9.5, "dir": "out", "mess')
    with (folder / "video.mp4").open("ab") as f:
        f.write(payload(2)[:40])

    r = b.reopen(rid, saved(handed, kept_from=1))  # the store kept the payloads of chunks 1 and 2
    r.handed_out(ack("e2"))
    r.handed_out(chunk(3))
    r.session_ended()
    b.settle()

    assert r.state is RecordingState.COMPLETE
    assert (folder / "video.mp4").read_bytes() == b"".join(payload(i) for i in range(4))  # one stream, each once
    out = owner_out(folder)
    indices = [m["transport_chunk_index"] for m in out if m["type"] == "video.chunk_metadata"]
    assert indices == [0, 1, 2, 3]
    assert [m.get("event_id") for m in out if m["type"] == "session.interaction.queued"] == ["e1", "e2"]
    times = [e["t"] for e in lines(folder)]
    assert times == sorted(times)
    manifest = json.loads((folder / MANIFEST).read_text())
    assert manifest["status"] == "complete" and manifest["chunks"] == 4 and manifest["frames"] == 36
    assert manifest["started_at"] == started and manifest[TOKEN_DIGEST] == DIGEST
    assert manifest["request_id"] == "video_stream-9" and manifest["config"]["seed"] == 3
    assert manifest["bytes"] == (folder / "video.mp4").stat().st_size + (folder / "events.jsonl").stat().st_size
    assert not (folder / LIVE).exists()
    assert b.store.authorised(rid, "rk1.the-recording") is not None  # its token opens it still


def test_what_the_killed_holder_had_not_written_comes_from_the_session_store(
    tmp_path: Path, proxies: tuple[Proxy, Proxy]
) -> None:
    """Chunk 2, an ack and an interaction were handed out but still queued when the holder was
    killed; the interaction written before the kill is not written again."""
    a, b = proxies
    on_disk = interaction("e1", "a storm")
    queued = interaction("e2", "a calm")
    handed: list[Frame | dict[str, Any]] = [Frame(json.dumps(START), START), chunk(0), on_disk, ack("e1"), chunk(1)]
    rid = ids.new_id()
    r = a.begin(rid)
    for item in handed:
        r.received(item, None) if isinstance(item, dict) else r.handed_out(item)
    a.writer.shutdown(wait=True)
    log = saved([*handed, queued, ack("e2"), chunk(2)], kept_from=2)

    again = b.reopen(rid, log)
    again.handed_out(chunk(3))
    again.session_ended()
    b.settle()

    folder = tmp_path / rid
    assert (folder / "video.mp4").read_bytes() == b"".join(payload(i) for i in range(4))
    said = [e for e in lines(folder) if e["dir"] == "in" and e["message"]["type"] == "session.interaction"]
    inbound = [(e["participant"], e["message"]["interaction"]["event_id"]) for e in said]
    assert inbound == [("owner", "e1"), ("unknown", "e2")]  # the store keeps no sender
    kinds = [(m["type"], m.get("transport_chunk_index", m.get("event_id"))) for m in owner_out(folder)]
    assert kinds[1:] == [
        ("video.chunk_metadata", 0),
        ("session.interaction.queued", "e1"),
        ("video.chunk_metadata", 1),
        ("session.interaction.queued", "e2"),
        ("video.chunk_metadata", 2),
        ("video.chunk_metadata", 3),
    ]


def test_a_chunk_neither_written_nor_kept_ends_the_recording_at_a_whole_chunk(
    tmp_path: Path, proxies: tuple[Proxy, Proxy]
) -> None:
    a, b = proxies
    handed = [Frame(json.dumps(START), START), chunk(0), chunk(1), chunk(2)]
    rid = killed(a, handed[:2])
    r = b.reopen(rid, saved(handed, kept_from=2))  # chunk 1 was not written, and the store forgot it
    r.handed_out(chunk(3))
    r.session_ended()
    b.settle()
    folder = tmp_path / rid
    assert r.state is RecordingState.TRUNCATED
    assert (folder / "video.mp4").read_bytes() == payload(0)  # no gap: it ends before the lost chunk
    manifest = json.loads((folder / MANIFEST).read_text())
    assert manifest["status"] == "truncated" and "chunk 1" in manifest["reason"] and manifest["chunks"] == 1


def test_what_the_holder_wrote_past_the_session_store_is_replaced(tmp_path: Path, proxies: tuple[Proxy, Proxy]) -> None:
    """The holder wrote chunk 2 but was killed before the store had it: the session goes on from
    chunk 1, and the chunk 2 the new holder hands out replaces it."""
    a, b = proxies
    handed = [Frame(json.dumps(START), START), chunk(0), chunk(1), chunk(2)]
    rid = killed(a, handed)
    r = b.reopen(rid, saved(handed[:3]))
    again = chunk(2)
    again = Frame(again.text, again.message, b"Z" * len(again.data or b""))
    r.handed_out(again)
    r.session_ended()
    b.settle()
    folder = tmp_path / rid
    assert (folder / "video.mp4").read_bytes() == payload(0) + payload(1) + b"Z" * len(payload(2))
    assert [m["transport_chunk_index"] for m in owner_out(folder) if "transport_chunk_index" in m] == [0, 1, 2]


def test_a_recording_that_cannot_go_on_leaves_the_session_unrecorded(
    tmp_path: Path, proxies: tuple[Proxy, Proxy]
) -> None:
    _, b = proxies
    r = b.reopen(ids.new_id(), saved([chunk(0)]))
    r.handed_out(chunk(1))
    r.session_ended()
    b.settle()
    assert r.state is RecordingState.NOT_CONTINUED and b.not_continued() == 1.0
    assert list(tmp_path.iterdir()) == []  # nothing written for it


def test_a_recording_the_holder_is_still_closing_is_appended_to_only_once_closed(
    tmp_path: Path, proxies: tuple[Proxy, Proxy]
) -> None:
    """A handoff: the old holder's writer is still busy when the new holder reopens the
    recording; what the new holder hands out is held until the old one wrote its manifest."""
    a, b = proxies
    handed = [Frame(json.dumps(START), START), chunk(0), chunk(1)]
    rid = ids.new_id()
    old = a.begin(rid)
    gate = threading.Event()
    a.writer.submit(gate.wait)  # the old holder's disk is slow: its last writes are queued
    for frame in handed:
        old.handed_out(frame)
    old.session_ended()  # the handoff: it closes the recording once its queue is written
    r = b.reopen(rid, saved(handed), holder_gone=False)
    r.handed_out(chunk(2))
    gate.set()
    a.writer.shutdown(wait=True)
    r.session_ended()
    b.settle()
    folder = tmp_path / rid
    assert (folder / "video.mp4").read_bytes() == payload(0) + payload(1) + payload(2)
    manifest = json.loads((folder / MANIFEST).read_text())
    assert manifest["status"] == "complete" and manifest["chunks"] == 3


def test_a_live_recording_of_another_proxy_is_neither_closed_nor_evicted(tmp_path: Path) -> None:
    a, b = Proxy(str(tmp_path)), Proxy(str(tmp_path))
    rid = killed(a, [Frame(json.dumps(START), START), chunk(0)])
    assert b.store.close_leftovers() == []  # written a moment ago: it may be live on the other proxy
    assert b.store.close_leftovers(now=time.time() + LEFTOVER_QUIET_SECONDS + 1) == [rid]
    manifest = b.store.manifest(rid)
    assert manifest is not None and manifest["status"] == "incomplete" and manifest[TOKEN_DIGEST] == DIGEST
    assert manifest["started_at"] > 0 and not (tmp_path / rid / LIVE).exists()

    finished = Proxy(str(tmp_path))
    done = finished.begin(ids.new_id())
    done.handed_out(chunk(0))
    done.session_ended()
    finished.writer.shutdown(wait=True)  # finished's index holds it; now another proxy takes it over
    taker = Proxy(str(tmp_path))
    r = taker.reopen(done.rid, saved([chunk(0)]), holder_gone=False)
    r.handed_out(chunk(1))
    taker.waiter.shutdown(wait=True)
    taker.writer.submit(lambda: None).result()  # the reopening is written: it is live on `taker`
    finished.store.limits = Limits(max_bytes=1, max_age=0)
    assert finished.store.evict() == [] and (tmp_path / done.rid / "video.mp4").exists()
    assert not finished.store.delete(done.rid)
    for proxy in (a, b, finished, taker):
        proxy.settle()


def test_an_fsspec_recording_goes_on_from_what_was_published() -> None:
    url = f"memory://rtvideo-reopen-{ids.new_id()}"
    a, b = Proxy(url), Proxy(url)
    handed = [Frame(json.dumps(START), START), chunk(0)]
    old = a.begin(ids.new_id())
    for frame in handed:
        old.handed_out(frame)
    old.session_ended()
    a.settle()
    r = b.reopen(old.rid, saved(handed), holder_gone=False)
    r.handed_out(chunk(1))
    r.session_ended()
    b.settle()
    opened = b.store.open(old.rid, "video.mp4")
    assert opened is not None and opened[0].read() == payload(0) + payload(1)
    manifest = b.store.manifest(old.rid)
    assert manifest is not None and manifest["status"] == "complete" and manifest["chunks"] == 2
