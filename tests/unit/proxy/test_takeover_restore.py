"""A session taken over from the store, driven by hand (rtvideo.proxy.session.continuity,
rtvideo.proxy.participants.takeover): what one proxy writes as the session happens is what
another rebuilds it from: the same event book, the start that goes on at the next chunk with
its seed and started events, what the client missed given again, acked events sent again."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from rtvideo.backend.media.encoder import FragmentedMp4Encoder
from rtvideo.core.fmp4 import FragmentCursor, split_init
from rtvideo.proxy.observability.metrics import ProxyMetrics
from rtvideo.proxy.participants.features import Features
from rtvideo.proxy.participants.links import Owner
from rtvideo.proxy.participants.tokens import ResumeRefused, TokenBook
from rtvideo.proxy.session.record import SavedFrame, SavedSession, token_hash
from rtvideo.proxy.session.session import ProxySession
from rtvideo.proxy.settings import ProxySettings
from rtvideo.proxy.store.keeper import StoreKeeper
from rtvideo.proxy.store.memory import MemoryStore
from rtvideo.triton.wire import START_TAG
from tests.support.fake_bridge import FakeBridge, FakeConnection, begin, reply, run
from tests.unit.proxy.test_moves import CONFIG, frames, interaction, media

SID = "s-restore"


def replica(
    store: MemoryStore, holder: str, **settings: Any
) -> tuple[ProxySession, FakeConnection, FakeBridge, StoreKeeper]:
    config, metrics = ProxySettings(**settings), ProxyMetrics()
    features = Features(config, shared=True)
    for book in (features.resume_tokens, features.watch_tokens, features.steer_tokens):
        book.instance = store.cluster
    conn, bridge = FakeConnection(), FakeBridge()
    keeper = StoreKeeper(store, SID, holder, metrics.store_call, payload_bytes=config.replay_buffer_bytes)
    owner = Owner(conn, "test", config, metrics)  # type: ignore[arg-type]
    s = ProxySession(owner, bridge, config, metrics, lambda _: None, features, keeper)  # type: ignore[arg-type]
    conn.on_close = s.on_disconnect
    return s, conn, bridge, keeper


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def held_session(store: MemoryStore, **settings: Any) -> tuple[ProxySession, FakeConnection, list[bytes]]:
    """On replica a: two chunks (p1 started in the first), p2 acked but not started."""
    s, conn, _, _ = replica(store, "a", **settings)
    begin(s)
    s.on_reply(reply(START_TAG, {"type": "video.start", "request_id": "r", "config": CONFIG}))
    encoder = FragmentedMp4Encoder(64, 48, 16)
    payloads = [encoder.encode_chunk(frames(k)) for k in range(2)]
    s.on_frame(interaction("p1", "a storm"), False)
    await settle()
    s.on_reply(media("r", 0, 0, payloads[0], ("p1",)))
    s.on_reply(media("r", 1, 1, payloads[1]))
    s.on_frame(interaction("p2", "a desert"), False)
    await settle()
    return s, conn, payloads


def test_a_replica_rebuilds_the_session_from_what_the_holder_wrote() -> None:
    async def body() -> tuple[list[Any], list[Any], list[tuple[bytes, bool, bool]], SavedSession]:
        store = MemoryStore()
        _, conn_a, _ = await held_session(store)
        token = conn_a.texts()[0]["resume_token"]
        assert [t["type"] for t in conn_a.texts()].count("session.interaction.queued") == 2
        stored = await store.load(SID)
        assert stored is not None
        saved = SavedSession.read(stored)
        assert saved.token_hashes["resume"] == token_hash(token) and token not in json.dumps(stored.fields)
        await store.release(SID, _held(store))  # a is gone: its lease too
        b, conn_b, bridge_b, keeper = replica(store, "b")
        lease = await store.acquire(SID, "b")
        assert lease is not None
        keeper.start(lease)  # as takeover.py does
        b.take_over(saved, 0, token)  # the client had the first chunk whole
        await settle()
        return conn_a.frames, conn_b.frames, bridge_b.streams[0].sent, saved

    _, got, sent, saved = run(body())
    start, init_meta, init = got[0], got[1], got[2]
    assert start["type"] == "video.start" and start["resumed"] is True and start["request_id"] == "r"
    assert init_meta["kind"] == "init" and isinstance(init, bytes)
    rest = [f["type"] if isinstance(f, dict) else "payload" for f in got[3:]]
    # after pair 0: what was handed out after it, in order (p2's ack was handed out after pair 1)
    assert rest == ["video.chunk_metadata", "payload", "session.interaction.queued"], rest
    moved = json.loads(sent[0][0])
    assert sent[0][1] is True and moved["seed"] == 7 and moved["rebuild"]["generation_chunk_index"] == 2
    assert [e["interaction"]["event_id"] for e in moved["rebuild"]["events"]] == ["p1"]
    again = [json.loads(raw)["interaction"]["event_id"] for raw, _, _ in sent[1:]]
    assert again == ["p2"]  # acked, not started: sent again
    assert [e.index for e in saved.log if isinstance(e, SavedFrame) and e.index is not None] == [0, 1]


def _held(store: MemoryStore) -> Any:
    """The live lease (the test's replica a never released it)."""
    return store._sessions[SID].lease


def test_a_resume_older_than_what_the_store_keeps_is_refused_and_changes_nothing() -> None:
    async def body() -> str:
        store = MemoryStore()
        _, conn_a, _ = await held_session(store, replay_buffer_bytes=1)  # only the newest payload kept
        token = conn_a.texts()[0]["resume_token"]
        stored = await store.load(SID)
        assert stored is not None and sorted(stored.payloads) == [1]
        from rtvideo.proxy.participants.takeover import _check  # the refusal before anything is built

        try:
            _check(stored, stored, token_hash(token), -1, 30.0)
        except ResumeRefused as exc:
            return exc.message
        return ""

    assert "oldest resumable index is 0" in run(body())


def test_a_cursor_restored_from_sizes_continues_as_one_that_read_the_payloads() -> None:
    encoder = FragmentedMp4Encoder(64, 48, 16)
    payloads = [encoder.encode_chunk(frames(k)) for k in range(3)]
    read, restored = FragmentCursor(), FragmentCursor()
    for payload in payloads:
        read.media(payload, 9)
    restored.init = split_init(payloads[0])[0]
    for payload in payloads[:2]:
        restored.passed(len(payload), 9, 16)
    restored.media(payloads[2], 9)
    assert (restored.bytes, restored.frames, restored.init) == (read.bytes, read.frames, read.init)
    assert restored.index.entries == read.index.entries and restored.index.track_id == read.index.track_id


def test_an_adopted_token_opens_its_session_and_retires_by_its_hash() -> None:
    book: TokenBook[str] = TokenBook("wv1", instance="shared")
    other: TokenBook[str] = TokenBook("wv1", instance="shared")
    token = other.issue("elsewhere")
    try:
        book.find(token)
    except ResumeRefused as exc:
        assert exc.unknown  # a token of the instance, never seen here: the store may know it
    book.adopt(token_hash(token), "here")
    assert book.find(token) == "here"
    book.retire_hash(token_hash(token), "the session has ended")
    try:
        book.find(token)
    except ResumeRefused as exc:
        assert exc.message == "the session has ended" and not exc.unknown
