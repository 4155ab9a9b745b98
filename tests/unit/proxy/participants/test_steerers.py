"""Guest steerers of a session, driven by hand (no Triton, no sockets): answers reach their
sender only, the owner alone stops or revokes, and a steerer's in-flight share (docs/protocol.md §9.3)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from rtvideo.core.resume import ResumeRefused
from rtvideo.proxy.participants.features import Features
from rtvideo.proxy.participants.steerers import REVOKED_CLOSE_CODE, GuestSteerer
from rtvideo.proxy.session.session import ProxySession
from rtvideo.triton.wire import START_TAG
from tests.support.fake_bridge import VIDEO_START, FakeBridge, FakeConnection, begin, build, reply, run, settle


def _interaction(event_id: str, prompt: str = "a harbour") -> str:
    return json.dumps(
        {"type": "session.interaction", "interaction": {"event_id": event_id, "event": {"prompt": prompt}}}
    )


def _steerable(**settings: Any) -> tuple[ProxySession, FakeConnection, FakeBridge, Features]:
    """A session built with guests (tests.support.fake_bridge `build`), started steerable."""
    s, conn, bridge, features, _ = build("owner", guests=True, **settings)
    assert features is not None
    begin(s, json.dumps({"type": "session.start", "prompt": "a harbour", "steerable": True}))
    s.on_reply(VIDEO_START)
    return s, conn, bridge, features


async def _join(s: ProxySession, owner: FakeConnection, features: Features) -> tuple[FakeConnection, GuestSteerer]:
    await settle()
    session = features.steer_tokens.find(owner.texts()[0]["steer_token"])
    assert session.attachments.steer_refusal() is None
    link = FakeConnection()
    steerer = session.attachments.attach_steerer(link, "guest")
    assert steerer is not None
    return link, steerer


def _types(conn: FakeConnection) -> list[str]:
    return [m["type"] for m in conn.texts()]


def test_answers_go_to_their_sender_only() -> None:
    async def body() -> tuple[FakeConnection, FakeConnection, FakeBridge]:
        s, owner, bridge, features = _steerable()
        link, steerer = await _join(s, owner, features)
        s.steering.frame(steerer, _interaction("g1"), False)
        s.steering.frame(steerer, json.dumps({"type": "session.ping"}), False)
        s.steering.frame(s.owner, _interaction("o1"), False)
        bad = json.dumps({"type": "session.interaction", "interaction": {"event_id": "g2", "event": {}}})
        s.steering.frame(steerer, bad, False)  # invalid: forwarded, the model answers it
        tag = bridge.streams[0].sent[-1]
        assert b'"g2"' in tag[0]
        await settle()
        s.on_reply(
            reply(
                f"m{len(bridge.streams[0].sent)}",
                {"type": "error", "code": "invalid_interaction", "event_id": "g2", "message": "x"},
            )
        )
        failed = {
            "type": "error",
            "code": "interaction_failed",
            "event_id": "g1",
            "message": "not supported",
            "request_id": "r",
        }
        s.on_reply(reply(START_TAG, failed))  # decided after the ack, on the start stream
        await settle()
        return owner, link, bridge

    owner, link, _ = run(body())
    shared = "session.interaction.shared"  # a notice of another's acked update, not an answer
    owner_answers = [(m["type"], m.get("event_id")) for m in owner.texts()[1:] if m["type"] != shared]
    guest_answers = [(m["type"], m.get("event_id"), m.get("code")) for m in link.texts()[1:] if m["type"] != shared]
    assert owner_answers == [("session.interaction.queued", "o1")]
    assert guest_answers == [
        ("session.interaction.queued", "g1", None),
        ("session.pong", None, None),
        ("error", "g2", "invalid_interaction"),
        ("error", "g1", "interaction_failed"),
    ]
    assert [m["event_id"] for m in owner.texts() if m["type"] == shared] == ["g1"]  # g2 was never acked
    assert [m["event_id"] for m in link.texts() if m["type"] == shared] == ["o1"]
    assert link.texts()[0]["steerer"] is True and "steer_token" not in link.texts()[0]


def test_only_the_owner_stops_or_revokes_and_a_revoke_is_final() -> None:
    async def body() -> tuple[FakeConnection, FakeConnection, FakeBridge, Features, str]:
        s, owner, bridge, features = _steerable()
        link, steerer = await _join(s, owner, features)
        for kind in ("session.stop", "session.revoke_steering"):
            s.steering.frame(steerer, json.dumps({"type": kind}), False)
        s.steering.frame(steerer, json.dumps({"type": "session.playback", "position_seconds": 1.0}), False)  # dropped
        await settle()
        assert not any(end for _, _, end in bridge.streams[0].sent)  # no sequence_end went
        s.steering.frame(s.owner, json.dumps({"type": "session.revoke_steering"}), False)
        s.steering.frame(s.owner, json.dumps({"type": "session.revoke_steering"}), False)
        await settle()
        return owner, link, bridge, features, owner.texts()[0]["steer_token"]

    owner, link, _, features, token = run(body())
    assert [(m["type"], m.get("code")) for m in link.texts()[1:]] == [("error", "invalid_message")] * 2
    assert link.closed == REVOKED_CLOSE_CODE
    revoked = [m for m in owner.texts() if m["type"] == "session.steering_revoked"]
    assert [m["revoked"] for m in revoked] == [1, 0] and revoked[0]["request_id"] == "r"
    with pytest.raises(ResumeRefused, match="revoked"):
        features.steer_tokens.find(token)
    assert features.steerers.count == 0


def test_a_steerer_has_its_own_share_of_the_requests_in_flight() -> None:
    async def body() -> FakeConnection:
        s, owner, _, features = _steerable(max_requests_in_flight=8)  # a share of 2
        link, steerer = await _join(s, owner, features)
        for i in range(3):  # the model answers none of them
            s.steering.frame(steerer, _interaction(f"g{i}"), False)
        s.steering.frame(s.owner, _interaction("o1"), False)  # the owner is within the session's bound
        await settle()
        answers = [m.get("event_id") for m in owner.texts()[1:] if m["type"] != "session.interaction.shared"]
        assert answers == ["o1"]
        return link

    link = run(body())
    answers = [
        (m["type"], m.get("event_id"), m.get("code"))
        for m in link.texts()[1:]
        if m["type"] != "session.interaction.shared"
    ]
    assert answers == [
        ("session.interaction.queued", "g0", None),
        ("session.interaction.queued", "g1", None),
        ("error", "g2", "rate_limited"),
    ]


def test_bounds_per_session_and_steerable_off() -> None:
    async def body() -> tuple[str | None, str | None]:
        s, owner, _, features = _steerable(max_steerers_per_session=1)
        await _join(s, owner, features)
        session = features.steer_tokens.find(owner.texts()[0]["steer_token"])
        full = session.attachments.steer_refusal()
        _s2, owner2, _, _ = _steerable(max_steerers_per_session=0)
        await settle()
        return full, owner2.texts()[0].get("steer_token")

    full, token = run(body())
    assert full is not None and "--max-steerers-per-session" in full
    assert token is None


def test_a_steer_token_is_never_logged() -> None:
    from rtvideo.proxy.observability.accesslog import redact_text

    line = redact_text("GET /v1/realtime/video/steer?steer_token=sv1.0123456789abcdef.SECRET&x=1")
    assert "SECRET" not in line and "steer_token=" in line


def test_over_triton_the_model_answers_a_revoke_with_none_revoked() -> None:
    """A direct gRPC client has no steerers: the model answers (final) that none were revoked."""
    from tests.unit.backend.test_playback_pacing import manager, request, stop, wait_chunks

    mgr = manager()
    stream = request(mgr, {"type": "session.start", "prompt": "p", "fps": 16}, start=True)
    wait_chunks(stream, 1)
    answer = request(mgr, {"type": "session.revoke_steering"})
    assert answer.sent and answer.sent[0][2] is True
    message = answer.sent[0][0]
    assert message["type"] == "session.steering_revoked" and message["revoked"] == 0
    stop(mgr, stream)
    mgr.shutdown()
