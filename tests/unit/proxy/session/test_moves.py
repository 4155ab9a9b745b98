"""A session moving to another Triton, driven by hand (rtvideo.proxy.session.mover): what the new model is
sent, how its stream is spliced onto the old one, and what happens when it refuses."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import numpy as np

from rtvideo.backend.media.encoder import FragmentedMp4Encoder
from rtvideo.proxy.placement.bridge import BackendUnavailable
from rtvideo.proxy.placement.placed_stream import PlacedStream
from rtvideo.proxy.session.mover import MoveReason
from rtvideo.triton.wire import START_TAG
from tests.support.fake_bridge import FakeConnection, begin, ended, reply, run, session

START = json.dumps({"type": "session.start", "prompt": "a harbour", "width": 64, "height": 48})
CONFIG = {"seed": 7, "fps": 16, "width": 64, "height": 48, "frames_per_chunk": 9}


def frames(k: int) -> np.ndarray:
    return np.full((9, 48, 64, 3), 10 * k, np.uint8)


def media(rid: str, transport: int, generation: int, payload: bytes, started: tuple[str, ...] = ()) -> Any:
    meta = {
        "type": "video.chunk_metadata",
        "request_id": rid,
        "kind": "media",
        "transport_chunk_index": transport,
        "generation_chunk_index": generation,
        "num_frames": 9,
        "byte_length": len(payload),
        "started_event_ids": list(started),
        "active_event_ids": list(started),
        "completed_event_ids": [],
        "superseded_event_ids": [],
        "interrupted_event_ids": [],
        "transition_progress": {e: 0.5 for e in started},
    }
    return reply(START_TAG, meta, payload)


def interaction(event_id: str, prompt: str) -> str:
    return json.dumps(
        {"type": "session.interaction", "interaction": {"event_id": event_id, "event": {"prompt": prompt}}}
    )


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def moved_session() -> tuple[Any, FakeConnection, Any]:
    """A session with one chunk (p1 started in it) and p2 acked, whose stream then breaks."""
    s, conn, bridge = session()
    begin(s)
    s.on_reply(reply(START_TAG, {"type": "video.start", "request_id": "r", "config": CONFIG}))
    s.steering.frame(s.owner, interaction("p1", "a storm"), False)
    s.on_reply(reply("m2", {"type": "session.interaction.queued", "request_id": "r", "event_id": "p1"}))
    s.on_reply(media("r", 0, 0, FragmentedMp4Encoder(64, 48, 16).encode_chunk(frames(0)), ("p1",)))
    s.steering.frame(s.owner, interaction("p2", "a desert"), False)
    await settle()
    bridge.streams[0].cancel()  # the stream ends under the live session: Triton is gone
    await settle()
    return s, conn, bridge


def test_the_new_model_rebuilds_the_session_and_its_stream_continues_the_old() -> None:
    async def body() -> tuple[list[Any], list[Any], float]:
        s, conn, bridge = await moved_session()
        assert len(bridge.streams) == 2, "the session moved to a new stream"
        new = bridge.streams[1]
        start = json.loads(new.sent[0][0])
        assert new.sent[0][1] is True and start["seed"] == 7 and start["prompt"] == "a harbour"
        assert start["rebuild"]["generation_chunk_index"] == 1
        assert [(e["chunk"], e["named"], e["interaction"]["event_id"]) for e in start["rebuild"]["events"]] == [
            (0, True, "p1")
        ]
        assert [json.loads(raw)["interaction"]["event_id"] for raw, _, _ in new.sent[1:]] == ["p2"]  # sent again
        fresh = FragmentedMp4Encoder(64, 48, 16)  # the new model's encoder
        new._replies.put_nowait(reply(START_TAG, {"type": "video.start", "request_id": "r2", "config": CONFIG}))
        new._replies.put_nowait(
            reply("m2", {"type": "session.interaction.queued", "request_id": "r2", "event_id": "p2"})
        )
        new._replies.put_nowait(media("r2", 0, 1, fresh.encode_chunk(frames(1)), ("p2",)))
        await settle()
        s.steering.frame(s.owner, json.dumps({"type": "session.stop"}), False)
        await ended(s, conn)
        return conn.frames, conn.texts(), s.metrics  # type: ignore[return-value]

    frames_out, texts, _ = run(body())
    kinds = [t["type"] for t in texts]
    assert kinds.count("video.start") == 1 and kinds.count("session.interaction.queued") == 2  # p1, p2 once each
    assert "error" not in kinds and kinds[-1] == "session.done"
    chunks = [t for t in texts if t["type"] == "video.chunk_metadata"]
    assert [(c["request_id"], c["transport_chunk_index"], c["generation_chunk_index"]) for c in chunks] == [
        ("r", 0, 0),
        ("r", 1, 1),
    ]
    payloads = [f for f in frames_out if isinstance(f, bytes)]
    assert payloads[0][4:8] == b"ftyp" and payloads[1][4:8] == b"moof"  # one init segment, first
    assert chunks[1]["byte_length"] == len(payloads[1])


def test_a_refused_rebuild_ends_the_session_as_before() -> None:
    async def body() -> list[dict[str, Any]]:
        s, conn, bridge = await moved_session()
        new = bridge.streams[1]
        refusal = {"type": "error", "code": "invalid_start", "message": "rebuild is not supported"}
        new._replies.put_nowait(reply(START_TAG, refusal))
        new._replies.put_nowait(reply(START_TAG, {"type": "session.done", "request_id": None, "chunks": 0}))
        new._replies.put_nowait(None)  # the model ends the refused sequence
        await ended(s, conn)
        assert len(bridge.streams) == 2  # one try: a refusal is not moved again
        assert not s.move(MoveReason.DRAIN)
        return conn.texts()

    texts = run(body())
    assert [t.get("code") for t in texts if t["type"] == "error"] == ["backend_unavailable"]
    assert texts[-1]["type"] == "session.done" and "invalid_start" not in json.dumps(texts)


class _NoEndpoints:
    """A pool with no endpoint that takes a session (every Triton is down)."""

    def attach(self, *args: Any) -> None: ...
    def detach(self, *args: Any) -> None: ...
    def start_answered(self, *args: Any) -> None: ...
    def start_refused(self, *args: Any, **kwargs: Any) -> None: ...
    def start_failed(self, *args: Any) -> None: ...
    def stream_failed(self, *args: Any) -> None: ...
    def spawn(self, coro: Any) -> None:
        coro.close()

    def candidates(self) -> list[Any]:
        return []


def test_a_moving_stream_waits_within_its_patience_and_a_cancel_ends_the_wait() -> None:
    """A move waits for an endpoint (the client's requests kept meanwhile); its patience over,
    it gives up; the session ending (a dropped client) ends the wait at once: nothing hangs."""

    async def read_one(stream: PlacedStream) -> None:
        async for _ in stream.replies():
            pass

    async def body() -> tuple[float, float]:
        patient = PlacedStream(_NoEndpoints(), [], patience=0.6)  # type: ignore[arg-type]
        patient.send(b"start", start=True)
        patient.send(b"an interaction sent meanwhile")
        t0 = asyncio.get_running_loop().time()
        with contextlib.suppress(BackendUnavailable):
            await asyncio.wait_for(read_one(patient), 5)
        gave_up = asyncio.get_running_loop().time() - t0
        waiting = PlacedStream(_NoEndpoints(), [], patience=60)  # type: ignore[arg-type]
        reader = asyncio.create_task(read_one(waiting))
        await asyncio.sleep(0.4)
        assert not reader.done()
        t1 = asyncio.get_running_loop().time()
        waiting.cancel()
        with contextlib.suppress(BackendUnavailable):
            await asyncio.wait_for(reader, 5)
        return gave_up, asyncio.get_running_loop().time() - t1

    gave_up, cancelled = run(body())
    assert 0.6 <= gave_up < 5 and cancelled < 5


def test_a_superseded_event_retried_after_a_move_is_acked_and_never_reaches_the_new_model() -> None:
    """p0 was acked and superseded before any chunk started it; after the move its retry (and one
    of p1, which started) is acked again by the proxy and not sent: the new model, which never
    heard of p0, would apply it."""

    async def body() -> tuple[list[Any], list[Any], list[Any]]:
        s, conn, bridge = session()
        begin(s)
        s.on_reply(reply(START_TAG, {"type": "video.start", "request_id": "r", "config": CONFIG}))
        s.steering.frame(s.owner, interaction("p0", "a fog"), False)
        s.steering.frame(s.owner, interaction("p1", "a storm"), False)
        chunk = media("r", 0, 0, FragmentedMp4Encoder(64, 48, 16).encode_chunk(frames(0)), ("p1",))
        s.on_reply(reply(START_TAG, {**chunk.message, "superseded_event_ids": ["p0"]}, chunk.data))
        await settle()
        old_sent = list(bridge.streams[0].sent)
        bridge.streams[0].cancel()
        await settle()
        new = bridge.streams[1]
        before = list(new.sent)
        s.steering.frame(s.owner, interaction("p0", "a fog"), False)
        s.steering.frame(s.owner, interaction("p1", "a storm"), False)
        await settle()
        after = list(new.sent)
        assert after == before, "a retry went to the new model"
        new._replies.put_nowait(reply(START_TAG, {"type": "video.start", "request_id": "r2", "config": CONFIG}))
        await settle()
        s.steering.frame(s.owner, json.dumps({"type": "session.stop"}), False)
        await ended(s, conn)
        return old_sent, before, conn.texts()

    old_sent, new_sent, texts = run(body())
    forwarded = [json.loads(raw).get("interaction", {}).get("event_id") for raw, _, _ in old_sent]
    assert forwarded.count("p0") == 1 and forwarded.count("p1") == 1
    start = json.loads(new_sent[0][0])
    assert [e["interaction"]["event_id"] for e in start["rebuild"]["events"]] == ["p1"]  # p0 never started
    assert len(new_sent) == 1  # nothing sent again: no acked event was left unstarted
    acks = [t["event_id"] for t in texts if t["type"] == "session.interaction.queued"]
    assert acks == ["p0", "p1", "p0", "p1"]  # each retry acked again
