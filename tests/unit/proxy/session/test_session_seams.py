"""The seams of a proxy session, driven by hand (no Triton, no sockets): a new owner attached on
resume, a watcher attached, the stream replaced (a move to another Triton), a recording sink."""

from __future__ import annotations

import json
from typing import Any

from rtvideo.proxy.frames import Frame
from rtvideo.proxy.participants.links import Owner
from rtvideo.proxy.settings import ProxySettings
from rtvideo.triton.wire import START_TAG
from tests.support.fake_bridge import (
    VIDEO_START,
    FakeConnection,
    begin,
    build,
    chunk,
    ended,
    kinds,
    reply,
    run,
    session,
    settle,
)

DONE = {"type": "session.done", "request_id": "r", "chunks": 2, "stopped": True}


class Recording:
    """A recording sink that keeps what it is given."""

    def __init__(self) -> None:
        self.frames: list[Frame] = []
        self.ended = 0

    def handed_out(self, frame: Frame) -> None:
        self.frames.append(frame)

    def session_ended(self) -> None:
        self.ended += 1


def test_a_recording_sink_sees_every_frame_handed_out_and_the_end_once() -> None:
    async def body() -> Recording:
        s, conn, _ = session()
        sink = Recording()
        s.handouts.record_to(sink)
        begin(s)
        s.on_reply(VIDEO_START)
        s.on_reply(chunk(0, 10))
        s.on_reply(reply(START_TAG, DONE))
        await ended(s, conn)
        return sink

    sink = run(body())
    assert [f.message["type"] for f in sink.frames] == ["video.start", "video.chunk_metadata", "session.done"]
    assert sink.frames[1].data == b"x" * 10
    assert sink.ended == 1


def test_a_replaced_stream_carries_the_session_on() -> None:
    """A move to another Triton: the old stream is cancelled, what was in flight on it is no longer
    counted, and the new one takes the requests and brings the replies."""

    async def body() -> tuple[list[Any], list[Any], list[Any], int]:
        s, conn, bridge = session()
        begin(s)
        s.on_reply(VIDEO_START)
        await settle()
        s.steering.frame(s.owner, json.dumps({"type": "session.interaction", "interaction": {"prompt": "x"}}), False)
        assert s.upstream.in_flight == 1
        moved = bridge.open_stream()
        s.upstream.take_over(moved, lambda raw: raw)
        in_flight = s.upstream.in_flight
        await moved._replies.put(chunk(0, 10))
        await settle()
        s.steering.frame(s.owner, json.dumps({"type": "session.stop"}), False)
        await ended(s, conn)
        return conn.frames, bridge.streams[0].sent, moved.sent, in_flight

    frames, old_sent, new_sent, in_flight = run(body())
    assert in_flight == 0
    assert ("video.chunk_metadata", 0) in kinds(frames)
    assert kinds(frames)[-1] == ("session.done", None)
    assert len(old_sent) == 2  # the start and the interaction; the stop went on the new stream
    assert new_sent[-1][2] is True  # sequence_end


def test_a_resume_attaches_a_new_owner_with_what_the_old_one_lost() -> None:
    async def body() -> tuple[FakeConnection, FakeConnection, list[Any]]:
        s, first, bridge, features, _ = build("first", guests=True, resume_grace_seconds=30)
        assert features is not None
        begin(s, json.dumps({"type": "session.start", "prompt": "a harbour", "resumable": True}))
        s.on_reply(VIDEO_START)
        s.on_reply(chunk(0, 10))
        await settle()
        token = next(f for f in first.texts() if f["type"] == "video.start")["resume_token"]
        s.on_disconnect(dropped=True)
        assert s.detached
        s.on_reply(chunk(1, 10))  # parked for the next owner
        second = FakeConnection()
        second.on_close = s.on_disconnect  # as the resumed connection's handler does
        owner = Owner(second, "second", ProxySettings(), s.metrics)  # type: ignore[arg-type]
        features.resume_tokens.find(token).attach_owner(owner, -1, token)
        assert s.peer == "second" and not s.detached
        await settle()
        s.on_reply(reply(START_TAG, DONE))
        await ended(s, second)
        return first, second, bridge.streams[0].sent

    first, second, sent = run(body())
    assert kinds(second.frames) == [
        ("video.start", None),
        ("video.chunk_metadata", 0),
        "<10 bytes>",
        ("video.chunk_metadata", 1),
        "<10 bytes>",
        ("session.done", None),
    ]
    assert second.texts()[0]["resumed"] is True
    assert second.texts()[0]["resume_token"] != first.texts()[0]["resume_token"]
    pauses = [json.loads(raw).get("pause") for raw, _, _ in sent if b'"pause"' in raw]
    assert pauses == [True, False]


def test_a_watcher_attaches_and_follows_the_pairs() -> None:
    async def body() -> FakeConnection:
        s, owner, _, features, _ = build("first", guests=True)
        assert features is not None
        begin(s, json.dumps({"type": "session.start", "prompt": "a harbour", "watchable": True}))
        s.on_reply(VIDEO_START)
        await settle()
        token = owner.texts()[0]["watch_token"]
        session_for_watch = features.watch_tokens.find(token)
        assert session_for_watch.attachments.watch_refusal() is None
        link = FakeConnection()
        assert session_for_watch.attachments.attach_watcher(link) is not None
        s.on_reply(chunk(0, 10))
        s.on_reply(reply(START_TAG, DONE))
        await ended(s, owner)
        await settle()
        return link

    link = run(body())
    assert kinds(link.frames) == [
        ("video.start", None),
        ("video.chunk_metadata", 0),
        "<10 bytes>",
        ("session.done", None),
    ]
    assert link.texts()[0]["watcher"] is True and "resume_token" not in link.texts()[0]
