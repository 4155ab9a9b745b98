"""A session taken over from the store, driven by hand (rtvideo.proxy.continuity.writer,
rtvideo.proxy.continuity.takeover): what one proxy writes as the session happens is what
another rebuilds it from: the same event book, the start that goes on at the next chunk with
its seed and started events, what the client missed given again, acked events sent again."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from rtvideo.backend.media.encoder import FragmentedMp4Encoder
from rtvideo.core.fmp4 import FragmentCursor, split_init
from rtvideo.core.resume import ResumeRefused
from rtvideo.proxy.continuity.record import SavedFrame, SavedSession, token_hash
from rtvideo.proxy.participants.tokens import TokenBook
from rtvideo.proxy.session.session import ProxySession
from rtvideo.proxy.settings import ProxySettings
from rtvideo.proxy.store.keeper import StoreKeeper
from rtvideo.proxy.store.memory import MemoryStore
from rtvideo.triton.wire import START_TAG
from tests.support.fake_bridge import FakeBridge, FakeConnection, begin, build, reply, run
from tests.unit.proxy.session.test_moves import CONFIG, frames, interaction, media

SID = "s-restore"


def replica(
    store: MemoryStore, holder: str, **settings: Any
) -> tuple[ProxySession, FakeConnection, FakeBridge, StoreKeeper]:
    s, conn, bridge, _, keeper = build(store=store, sid=SID, holder=holder, **settings)
    assert keeper is not None
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
    s.steering.frame(s.owner, interaction("p1", "a storm"), False)
    await settle()
    s.on_reply(media("r", 0, 0, payloads[0], ("p1",)))
    s.on_reply(media("r", 1, 1, payloads[1]))
    s.steering.frame(s.owner, interaction("p2", "a desert"), False)
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
        from rtvideo.proxy.continuity.takeover import _check  # the refusal before anything is built

        try:
            _check(stored, stored, token_hash(token), -1, ProxySettings())
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


class LaggingStore(MemoryStore):
    """A store whose writes of a pair never complete once `lag` is set: the holder hands a chunk
    to its client, then dies before the chunk's write lands."""

    lag = False

    async def append(self, sid: str, lease: Any, entries: Any, payload: Any) -> bool:
        if self.lag and payload is not None:
            await asyncio.Event().wait()
        return await super().append(sid, lease, entries, payload)


def test_a_resume_ahead_of_the_store_by_the_chunks_in_flight_goes_on_without_a_repeat() -> None:
    """The holder sent chunk 2 and died before its write: the client resumes from 2, one ahead of
    the store. The replica taking over accepts it, makes chunk 2 again from the store's position
    (takeover.py UNKEPT_TAIL_CHUNKS) and does not send it: the client's next pair is 3."""

    async def body() -> tuple[list[int], list[int], dict[str, Any], list[str]]:
        store = LaggingStore()
        a, conn_a, _ = await held_session(store)
        token = conn_a.texts()[0]["resume_token"]
        store.lag = True
        encoder = FragmentedMp4Encoder(64, 48, 16)
        for k in range(3):
            chunk = encoder.encode_chunk(frames(k))
        a.on_reply(media("r", 2, 2, chunk))
        await settle()
        sent_by_a = [t["transport_chunk_index"] for t in conn_a.texts() if t.get("kind") == "media"]
        assert sent_by_a == [0, 1, 2]  # the client has chunk 2; the store does not
        stored = await store.load(SID)
        assert stored is not None
        log = SavedSession.read(stored).log
        assert [e.index for e in log if isinstance(e, SavedFrame) and e.index is not None] == [0, 1]
        await store.release(SID, _held(store))  # a is gone
        store.lag = False
        from rtvideo.proxy.continuity.takeover import _check

        saved = _check(stored, stored, token_hash(token), 2, ProxySettings())  # ahead by the unkept tail: taken
        b, conn_b, bridge_b, keeper = replica(store, "b")
        lease = await store.acquire(SID, "b")
        assert lease is not None
        keeper.start(lease)
        b.take_over(saved, 2, token)
        await settle()
        new = bridge_b.streams[0]
        moved = json.loads(new.sent[0][0])
        fresh = FragmentedMp4Encoder(64, 48, 16)
        new._replies.put_nowait(reply(START_TAG, {"type": "video.start", "request_id": "r2", "config": CONFIG}))
        new._replies.put_nowait(media("r2", 0, 2, fresh.encode_chunk(frames(2))))  # chunk 2 made again
        new._replies.put_nowait(media("r2", 1, 3, fresh.encode_chunk(frames(3))))
        for _ in range(5):
            await settle()
        to_b = [t["transport_chunk_index"] for t in conn_b.texts() if t.get("kind") == "media"]
        kept = await store.load(SID)
        assert kept is not None
        in_store = [e.index for e in SavedSession.read(kept).log if isinstance(e, SavedFrame) and e.index is not None]
        return to_b, in_store, moved, [t["type"] for t in conn_b.texts()]

    to_b, in_store, moved, kinds = run(body())
    assert moved["rebuild"]["generation_chunk_index"] == 2  # made again from the store's position
    assert to_b == [3], to_b  # chunk 2 not sent again: no index twice, none missing
    assert in_store == [0, 1, 2, 3]  # the store has the chunk made again
    assert "error" not in kinds, kinds


def test_a_resume_further_ahead_than_the_chunks_in_flight_is_refused() -> None:
    async def body() -> str:
        store = MemoryStore()
        _, conn_a, _ = await held_session(store)
        token = conn_a.texts()[0]["resume_token"]
        stored = await store.load(SID)
        assert stored is not None
        from rtvideo.proxy.continuity.takeover import UNKEPT_TAIL_CHUNKS, _check

        try:
            _check(stored, stored, token_hash(token), 1 + UNKEPT_TAIL_CHUNKS + 1, ProxySettings())
        except ResumeRefused as exc:
            return exc.message
        return ""

    assert "was never sent (the last payload kept is 1)" in run(body())
