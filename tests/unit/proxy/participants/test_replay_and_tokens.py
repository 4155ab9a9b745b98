"""The replay buffer (rtvideo.proxy.participants.replay) and resume tokens (rtvideo.proxy.participants.tokens), alone."""

from __future__ import annotations

import json
import struct

import pytest

from rtvideo.core import protocol, server_messages
from rtvideo.core.chunks import init_metadata
from rtvideo.core.errors import ErrorCode, ProtocolError
from rtvideo.core.fmp4 import init_segment, strip_init
from rtvideo.core.resume import ResumeRefused, ResumeRequest, is_resume, parse_resume
from rtvideo.proxy.frames import Frame
from rtvideo.proxy.participants.features import take_options
from rtvideo.proxy.participants.links import Parked
from rtvideo.proxy.participants.replay import ReplayBuffer, ReplayGap
from rtvideo.proxy.participants.tokens import TokenBook
from rtvideo.proxy.session.upstream import PAUSE, UNPAUSE
from tests.support.probes import oldest_resumable


def _pair(index: int, size: int = 100) -> Frame:
    meta = {"type": protocol.CHUNK_METADATA, "kind": "media", "transport_chunk_index": index, "byte_length": size}
    return Frame(json.dumps(meta), meta, bytes(size))


def _ack(event_id: str) -> Frame:
    message = server_messages.queued("r", event_id)
    return Frame(json.dumps(message), message)


def test_a_resume_gets_every_frame_after_its_pair_acks_included() -> None:
    buffer = ReplayBuffer(10_000)
    frames = [_pair(0), _ack("a"), _pair(1), _pair(2), _ack("b")]
    for frame in frames:
        buffer.record(frame)
    buffer.record(Frame(json.dumps(server_messages.pong()), server_messages.pong()))  # never replayed
    assert buffer.after(-1) == frames
    assert buffer.after(0) == frames[1:]
    assert buffer.after(2) == [frames[4]]  # the ack the old connection may have lost
    with pytest.raises(ReplayGap) as ahead:
        buffer.after(3)
    assert ahead.value.oldest is None


def test_the_bound_evicts_whole_units_and_names_the_oldest_index() -> None:
    buffer = ReplayBuffer(1_000)
    for i in range(30):
        buffer.record(_ack(f"e{i}"))
        buffer.record(_pair(i))
    assert buffer.size <= 1_000
    oldest = oldest_resumable(buffer)
    assert oldest > 0
    with pytest.raises(ReplayGap) as gap:
        buffer.after(oldest - 1)
    assert gap.value.oldest == oldest and str(oldest) in str(gap.value)
    replay = buffer.after(oldest)
    assert replay[0].message["type"] == protocol.QUEUED  # the ack before pair oldest+1 is there
    assert replay[1].message["transport_chunk_index"] == oldest + 1


def test_the_newest_unit_stays_even_over_the_bound() -> None:
    buffer = ReplayBuffer(10)
    buffer.record(_pair(0, 500))
    buffer.record(_pair(1, 500))
    assert oldest_resumable(buffer) == 0 and [f.message["transport_chunk_index"] for f in buffer.after(0)] == [1]


def _box(kind: bytes, body: bytes = b"") -> bytes:
    return struct.pack(">I4s", 8 + len(body), kind) + body


def test_init_segment_is_the_ftyp_and_moov_at_the_head() -> None:
    init = _box(b"ftyp", b"isom") + _box(b"moov", b"x" * 20)
    media = _box(b"moof", b"m") + _box(b"mdat", b"d" * 10)
    assert init_segment(init + media) == init
    assert init_segment(media) is None
    assert strip_init(init + media) == media and strip_init(media) == media
    meta = init_metadata("r", len(init))
    assert meta["kind"] == "init" and meta["transport_chunk_index"] is None and meta["num_frames"] == 0


def test_tokens_are_long_random_single_use_and_tell_why() -> None:
    book = TokenBook("rv1")
    session = object()
    token = book.issue(session)  # type: ignore[arg-type]
    assert len(token.split(".")[2]) >= 43  # 256 bits, url-safe base64
    assert book.find(token) is session
    assert book.issue(session) != token  # type: ignore[arg-type]
    book.retire(token, "this token was used already")
    book.retire(token, "the session has ended")  # the first end is the one told
    with pytest.raises(ResumeRefused, match="used already"):
        book.find(token)
    with pytest.raises(ResumeRefused, match="unknown"):
        book.find(f"rv1.{book.instance}.{'A' * 43}")
    with pytest.raises(ResumeRefused, match="another proxy"):
        book.find(f"rv1.{'0' * 16}.{'A' * 43}")
    with pytest.raises(ResumeRefused, match="not a token"):
        book.find("nonsense")


def test_session_resume_is_validated() -> None:
    raw = json.dumps({"type": "session.resume", "resume_token": "t", "last_transport_chunk_index": -1})
    assert is_resume(raw) and not is_resume(b"x", binary=True)
    assert parse_resume(raw) == ResumeRequest("t", -1)
    for bad in (
        {"type": "session.resume", "resume_token": "", "last_transport_chunk_index": 0},
        {"type": "session.resume", "resume_token": "t", "last_transport_chunk_index": -2},
        {"type": "session.resume", "resume_token": "t"},
        {"type": "session.resume", "resume_token": "t", "last_transport_chunk_index": 0, "extra": 1},
    ):
        with pytest.raises(ProtocolError) as exc:
            parse_resume(json.dumps(bad))
        assert exc.value.code is ErrorCode.INVALID_RESUME


def test_start_options_are_taken_out_before_the_model_sees_them() -> None:
    first = {"type": "session.start", "prompt": "p", "resumable": True, "watchable": False}
    options, raw = take_options(dict(first), b"unused")
    assert options == {"resumable": True, "watchable": False} and json.loads(raw) == {
        "type": "session.start",
        "prompt": "p",
    }
    plain = b'{"type":"session.start","prompt":"p"}'
    assert take_options(json.loads(plain), plain) == ({}, plain)  # unchanged bytes without options
    with pytest.raises(ProtocolError):
        take_options({"type": "session.start", "prompt": "p", "resumable": "yes"}, b"")


def test_the_pause_is_a_keepalive_ping_and_parked_frames_are_bounded() -> None:
    pause, unpause = protocol.parse_message(PAUSE), protocol.parse_message(UNPAUSE)
    assert pause == protocol.PingRequest(keepalive=True, pause=True)
    assert unpause == protocol.PingRequest(keepalive=True, pause=False)
    assert protocol.parse_message(b'{"type":"session.ping"}') == protocol.PingRequest()
    parked = Parked([], 150)
    assert parked.put(_pair(0)) and not parked.put(_pair(1)) and parked.put(_pair(1), force=True)
    assert [f.message["transport_chunk_index"] for f in parked.take_unsent()] == [0, 1]


RID = server_messages.new_request_id()


def test_the_new_messages_validate() -> None:
    from tests.support.streams import schema_validator

    server, client = schema_validator("server_messages"), schema_validator("client_messages")
    config = {
        "prompt": "p", "format": "m4s", "model": "realtime_video", "width": 64, "height": 64, "fps": 16,
        "frames_per_chunk": 9, "default_transition_chunks": 4, "num_frames": None, "seed": 1, "ignored_fields": [],
        "resume_grace_seconds": 30.0,
    }  # fmt: skip
    start = {"type": "video.start", "request_id": RID, "format": "m4s", "config": config}
    for message in (
        {**start, "resume_token": "rv1.a.b", "watch_token": "wv1.a.b"},
        {**start, "resumed": True, "resume_token": "rv1.a.c"},
        {**start, "watcher": True},
        {**init_metadata(RID, 100)},
        {**server_messages.error(ErrorCode.INVALID_RESUME, "older than the buffer"), "oldest_resumable_index": 3},
    ):
        server.validate(message)
    resume = {"type": "session.resume", "resume_token": "rv1.a.b", "last_transport_chunk_index": -1}
    validator = type(client)
    validator({**client.schema["$defs"]["session.resume"], "$defs": client.schema["$defs"]}).validate(resume)
    start_def = {**client.schema["$defs"]["session.start"], "$defs": client.schema["$defs"]}
    validator(start_def).validate({"type": "session.start", "prompt": "p", "resumable": True, "watchable": True})
