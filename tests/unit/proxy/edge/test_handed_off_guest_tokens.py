"""A session handed to another replica lets its guests' tokens go, it does not end them
(rtvideo.proxy.participants.invitations `close`): its guests are closed with 1012 as soon as the
owner's link closes, which comes before the holder has finished its writes and released the
lease, and they rejoin at once, maybe at this replica. Told "the session has ended" there, a
guest door answered 403 while the store still named this replica (the rolling-restart test's
watchers and steerers gave up); told "unknown", the door asks the store (503 "moving" while
this replica still holds the lease, then where the session went)."""

from __future__ import annotations

import asyncio
import json

import pytest

from rtvideo.core.resume import ResumeRefused
from rtvideo.proxy.edge.relay import Where, locate
from rtvideo.proxy.participants.features import Features
from rtvideo.proxy.session.session import ProxySession
from rtvideo.proxy.store.memory import MemoryStore
from rtvideo.triton.wire import START_TAG
from tests.support.fake_bridge import FakeConnection, begin, build, reply, run
from tests.unit.proxy.session.test_moves import CONFIG

SID = "s-guests"
START = json.dumps(
    {"type": "session.start", "prompt": "a harbour", "width": 64, "height": 48, "watchable": True, "steerable": True}
)


async def guested(store: MemoryStore) -> tuple[ProxySession, FakeConnection, Features, dict[str, str]]:
    """A watchable, steerable session held by replica "a", and its guests' tokens."""
    s, conn, _, features, _ = build(store=store, sid=SID, holder="a")
    assert features is not None
    begin(s, START)
    s.on_reply(reply(START_TAG, {"type": "video.start", "request_id": "r", "config": CONFIG}))
    for _ in range(20):
        await asyncio.sleep(0)
    start = conn.texts()[0]
    return s, conn, features, {"watch": start["watch_token"], "steer": start["steer_token"]}


def refusal(features: Features, kind: str, token: str) -> ResumeRefused:
    book = features.watch_tokens if kind == "watch" else features.steer_tokens
    with pytest.raises(ResumeRefused) as refused:
        book.find(token)
    return refused.value


def test_a_guest_back_at_the_replica_that_hands_its_session_off_is_told_it_moves() -> None:
    async def body() -> None:
        store = MemoryStore()
        s, conn, features, tokens = await guested(store)
        seen: dict[str, bool] = {}  # kind → whether its token was unknown (not ended) at the close

        def closed() -> None:  # the owner's link closes (1012) while the holder still writes
            s.on_disconnect()
            for kind, token in tokens.items():
                seen[kind] = refusal(features, kind, token).unknown

        conn.on_close = closed
        await s.hand_off(5)
        assert set(seen) == {"watch", "steer"}
        for kind, token in tokens.items():
            assert seen[kind], kind  # unknown, not ended: the door asks the store
            assert refusal(features, kind, token).unknown
            # the lease released: a door anywhere finds the session moving (503, retry), not gone
            found = await locate(store, kind, token, "a", grace=30)
            assert found.where is Where.MOVING, (kind, found)

    run(body())


def test_a_guest_of_a_session_that_ended_here_is_told_it_ended() -> None:
    async def body() -> None:
        store = MemoryStore()
        s, conn, features, tokens = await guested(store)
        conn.on_close = s.on_disconnect
        conn.close(1000)  # the owner left: the session is over, not handed off
        for kind, token in tokens.items():
            refused = refusal(features, kind, token)
            assert not refused.unknown and refused.message == "the session has ended", kind

    run(body())
