"""What the session store holds of one session, and for how long (issue 46, item 2), against a real
redis-server: interactions as parsed, never the client's frame; no error frame a takeover does
not read; a per-session byte bound whose breach ends that session's keeping alone; every key
dropped when the session ends, also after the store failed at that moment; every key's expiry
within the resume grace and the lease; a store that refuses writes said so."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import redis.asyncio as aioredis

from rtvideo.core import protocol, server_messages
from rtvideo.core.errors import ErrorCode
from rtvideo.proxy.continuity.writer import Continuity
from rtvideo.proxy.frames import Frame
from rtvideo.proxy.session.acks import ProxyAcks
from rtvideo.proxy.session.ledger import Ledger
from rtvideo.proxy.store.base import SessionStore
from rtvideo.proxy.store.keeper import StoreKeeper, StoreState
from rtvideo.proxy.store.redis_store import PREFIX, RedisStore
from rtvideo.proxy.store.watch import StoreWatch
from tests.support.redis_server import serve_redis

T = TypeVar("T")
#: bounds a hang, never a speed: every test body is done in a few seconds on an idle machine
BODY_SECONDS = 60.0
PAD = "x" * 100_000
INTERACTIONS = 60
START = server_messages.encode({"type": protocol.START, "prompt": "a harbour"}).encode()


def run(url: str, body: Callable[[RedisStore, aioredis.Redis], Awaitable[T]], keep: float = 33.0) -> T:
    async def main() -> T:
        store = RedisStore(url, keep)
        client = aioredis.from_url(url)
        try:
            return await body(store, client)
        finally:
            await client.aclose()
            await store.close()

    return asyncio.run(asyncio.wait_for(main(), BODY_SECONDS))


def padded(event_id: str) -> tuple[dict[str, Any], bytes]:
    message = {
        "type": protocol.INTERACTION,
        "interaction": {"event_id": event_id, "event": {"prompt": f"a lighthouse {event_id}"}},
        "pad": PAD,
    }
    return message, server_messages.encode(message).encode()


def frame(message: dict[str, Any]) -> Frame:
    return Frame(server_messages.encode(message), message)


async def session_keys(client: aioredis.Redis, sid: str) -> list[bytes]:
    """`sid`'s keys: its record's, and the token bindings that name it (the fixture's Redis is
    shared with other tests)."""
    keys = [key async for key in client.scan_iter(match=f"{PREFIX}*{sid}*")]
    bindings = [key async for key in client.scan_iter(match=f"{PREFIX}k:*") if await client.get(key) == sid.encode()]
    return sorted(set(keys) | set(bindings))


async def memory_usage(client: aioredis.Redis, sid: str) -> int:
    total = 0
    for part in ("s", "f", "p"):
        total += int(await client.memory_usage(f"{PREFIX}{part}:{sid}") or 0)
    return total


def keeper(store: SessionStore, sid: str, **options: Any) -> StoreKeeper:
    return StoreKeeper(store, sid, "replica-a", lambda *_: None, **options)


def test_padded_interactions_and_a_rate_limited_flood_leave_only_the_parsed_session(redis_url: str) -> None:
    """60 interactions with a 100 kB pad beside `interaction` (6 MB sent; fewer than the 64 a
    session may have waiting for a chunk) and 600 rate_limited answers take what the same
    interactions without a pad take, and nothing more."""

    async def stored_bytes(store: RedisStore, client: aioredis.Redis, sid: str, pad: bool) -> tuple[int, list[str]]:
        await store.drop(sid)
        continuity = Continuity(keeper(store, sid))
        continuity.opened(START)
        acks = ProxyAcks(Ledger())
        for i in range(INTERACTIONS):
            message, raw = padded(f"e{i}")
            if not pad:
                message.pop("pad")
            ack = acks.decide(message, raw)
            assert ack is not None
            kept = continuity.event(ack.raw)
            assert kept is not None and await kept is not False
            continuity.taken(frame(server_messages.queued("r", f"e{i}")))
            if pad:
                for _ in range(10):
                    continuity.taken(
                        frame(
                            server_messages.error(ErrorCode.RATE_LIMITED, "too many", request_id="r", event_id=f"e{i}")
                        )
                    )
        continuity.taken(
            frame(server_messages.error(ErrorCode.INTERACTION_FAILED, "refused", request_id="r", event_id="e3"))
        )
        await continuity.event(None)  # the writes before it are in
        used = await memory_usage(client, sid)
        log = [entry.decode() for entry in await client.lrange(f"{PREFIX}f:{sid}", 0, -1)]
        await continuity.end()
        return used, log

    async def body(store: RedisStore, client: aioredis.Redis) -> None:
        plain, plain_log = await stored_bytes(store, client, "s-plain", pad=False)
        padded_bytes, padded_log = await stored_bytes(store, client, "s-padded", pad=True)
        assert padded_log == plain_log  # entry for entry: the pad and the floods left nothing
        assert len(padded_log) == 2 * INTERACTIONS + 1 and not any("rate_limited" in entry for entry in padded_log)
        assert sum('"interaction_failed"' in entry for entry in padded_log) == 1  # a takeover reads it
        assert padded_bytes <= plain * 1.1 and padded_bytes < INTERACTIONS * 1_000, (padded_bytes, plain)
        assert await session_keys(client, "s-padded") == []  # ended: dropped

    run(redis_url, body)


def test_the_bound_ends_one_sessions_keeping_and_leaves_another_kept(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    async def body(store: RedisStore, client: aioredis.Redis) -> None:
        bounded: list[str] = []
        flooder = keeper(store, "s-flooder", session_bytes=50_000, on_bounded=lambda: bounded.append("s-flooder"))
        honest = keeper(store, "s-honest", session_bytes=50_000, on_bounded=lambda: bounded.append("s-honest"))
        for k in (flooder, honest):
            await store.drop(k.sid)
            assert await k.start()
            k.put({"request_id": f"req-{k.sid}", "tokens": '{"resume": "' + k.sid + '"}'})
            k.bind({"resume": k.sid})
        acks = []
        for i in range(40):  # 40 × 4 kB: past 50 kB at the 13th
            acks.append(await flooder.event('{"prompt": "' + "p" * 4000 + f'", "i": {i}}}'))
            assert await honest.event(f'{{"prompt": "short", "i": {i}}}')
        assert all(acks)  # acked all along: past the bound without the store
        assert flooder.state is StoreState.BOUNDED and honest.state is StoreState.KEPT
        assert bounded == ["s-flooder"]
        await flooder.event(None)
        for _ in range(100):  # its record is dropped by a task of its own
            if not await session_keys(client, "s-flooder"):
                break
            await asyncio.sleep(0.05)
        assert [k for k in await session_keys(client, "s-flooder") if b"flooder" in k] == []
        assert await store.find("resume", "s-flooder") is None  # nobody can take it over
        stored = await store.load("s-honest")
        assert stored is not None and len(stored.log) == 40 and stored.holder == "replica-a"
        assert await store.find("resume", "s-honest") == "s-honest"
        assert await flooder.recheck()  # a resume here goes on: it is unkept, and found nowhere else
        await flooder.end(forget=True)
        await honest.end(forget=True)
        assert await session_keys(client, "s-honest") == []

    with caplog.at_level(logging.ERROR, logger="rtvideo.proxy.store.keeper"):
        run(redis_url, body)
    named = [r.getMessage() for r in caplog.records if "keeps at most" in r.getMessage()]
    assert len(named) == 1 and "session=s-flooder" in named[0] and "request_id=req-s-flooder" in named[0]


def test_every_key_of_a_session_expires_within_the_grace_and_the_lease(redis_url: str) -> None:
    async def body(store: RedisStore, client: aioredis.Redis) -> None:
        k = keeper(store, "s-ttl", payload_bytes=1000)
        await store.drop("s-ttl")
        assert await k.start()
        k.put({"request_id": "r", "tokens": '{"resume": "h-ttl", "watch": "w-ttl"}'})
        k.bind({"resume": "h-ttl", "watch": "w-ttl"})
        k.handed_out('{"type": "video.chunk_metadata"}', 0, b"payload")
        assert await k.event('{"prompt": "a"}')
        assert k.lease is not None and await store.renew("s-ttl", k.lease)
        keys = [f"{PREFIX}{part}:s-ttl" for part in ("s", "f", "p")] + [
            f"{PREFIX}k:resume:h-ttl",
            f"{PREFIX}k:watch:w-ttl",
        ]
        for key in keys:
            assert 0 < await client.ttl(key) <= 12, key  # never the hour it was
        await k.end(forget=True)
        assert [await client.exists(key) for key in keys] == [0] * len(keys)  # bindings included

    run(redis_url, body, keep=12.0)


def test_a_session_whose_drop_failed_is_dropped_once_the_store_is_back(tmp_path: Path) -> None:
    """Redis paused (SIGSTOP) as the session ends: its release and drop fail; the proxy's watch
    drops its record and token binding at its first look after SIGCONT."""
    with serve_redis(tmp_path) as server:
        assert server.proc is not None
        pid = server.proc.pid

        async def body(store: RedisStore, client: aioredis.Redis) -> None:
            found: list[str] = []
            watch = StoreWatch(store, found.append, lambda *_: None, keep_seconds=30)
            k = keeper(store, "s-paused", drop_later=watch.later, call_seconds=0.5)
            assert await k.start()
            k.put({"request_id": "r", "tokens": '{"resume": "h-paused"}'})
            k.bind({"resume": "h-paused"})
            assert await k.event('{"prompt": "a"}')
            os.kill(pid, signal.SIGSTOP)
            try:
                await k.end(forget=True)
                assert watch.pending == 1
                assert await watch.tend() == "unreachable" and watch.pending == 1
            finally:
                os.kill(pid, signal.SIGCONT)
            assert await watch.look() == "shared" and watch.pending == 1  # a health look drops nothing
            assert await watch.tend() == "shared" and watch.pending == 0
            assert found == ["unreachable", "shared", "shared"]
            assert await session_keys(client, "s-paused") == []

        run(server.url, body)


def test_a_drop_never_touches_a_session_another_replica_acquired_since(redis_url: str) -> None:
    async def body(store: RedisStore, client: aioredis.Redis) -> None:
        await store.drop("s-fenced")
        old = await store.acquire("s-fenced", "replica-a", ttl=0.2)
        assert old is not None and await store.put("s-fenced", old, {"tokens": '{"resume": "h-fenced"}'})
        await store.bind_token("resume", "h-fenced", "s-fenced")
        await asyncio.sleep(0.4)  # lapsed
        new = await store.acquire("s-fenced", "replica-b", ttl=5)
        assert new is not None
        await store.drop("s-fenced", old)  # the old holder's late drop: fenced
        assert await store.load("s-fenced") is not None and await store.find("resume", "h-fenced") == "s-fenced"
        await store.drop("s-fenced", new)
        assert await store.load("s-fenced") is None and await store.find("resume", "h-fenced") is None

    run(redis_url, body)


def test_a_full_store_is_said_to_refuse_writes(tmp_path: Path) -> None:
    """At its `maxmemory` (noeviction) Redis answers PING but refuses writes: the watch says
    `refusing_writes` (where a bare PING said `shared`), and `shared` once it takes writes again."""
    with serve_redis(tmp_path) as server:

        async def body(store: RedisStore, client: aioredis.Redis) -> None:
            found: list[str] = []
            watch = StoreWatch(store, found.append, lambda *_: None, keep_seconds=30)
            assert await watch.look() == "shared"
            await client.config_set("maxmemory-policy", "noeviction")
            await client.config_set("maxmemory", 1)
            try:
                assert await client.ping()
                assert await watch.look() == "refusing_writes" and watch.state == "refusing_writes"
            finally:
                await client.config_set("maxmemory", 0)
            assert await watch.look() == "shared"
            assert found == ["shared", "refusing_writes", "shared"]

        run(server.url, body)
