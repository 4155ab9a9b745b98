"""The share of the model's slots each client holds, as the store counts it (proxy/store
`claim_share`, `renew_shares`, `release_share`, `shares`), the same for the in-process store and
a real Redis server; and `SlotShares`, which counts each session of a proxy there and falls back
to its own count when the store does not answer. Expiries are short on purpose; the waits
only go past them, never bound how fast anything is."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import time
from pathlib import Path

import redis.asyncio as aioredis

from rtvideo.proxy.edge.slot_shares import SlotShares
from rtvideo.proxy.store import open_store
from rtvideo.proxy.store.base import SessionStore, StoreUnavailable
from rtvideo.proxy.store.memory import MemoryStore
from tests.support.redis_server import serve_redis
from tests.support.stores import with_store

_names = itertools.count()


def fresh(prefix: str) -> str:
    """A group of its own for each test (one Redis serves the whole test session)."""
    return f"{prefix}-{next(_names)}-2001:db8:{next(_names)}::/64"


def test_a_group_holds_at_most_its_share_and_only_live_entries_count(store_spec: str) -> None:
    async def body(store: SessionStore) -> None:
        group, other = fresh("g"), fresh("o")
        assert await store.claim_share(group, "s1", 2, 30) == (True, 1)
        assert await store.claim_share(group, "s2", 2, 30) == (True, 2)
        assert await store.claim_share(group, "s3", 2, 30) == (False, 2)  # full
        assert await store.claim_share(group, "s2", 2, 30) == (True, 2)  # one of them already: renewed
        assert await store.claim_share(other, "s3", 2, 30) == (True, 1)  # another client: its own share
        await store.release_share(group, "s1")
        assert await store.shares(group) == 1
        assert await store.claim_share(group, "s3", 2, 30) == (True, 2)
        # entries not renewed expire: a dead replica's sessions stop counting
        short = fresh("short")
        assert await store.claim_share(short, "a", 2, 0.3) == (True, 1)
        assert await store.claim_share(short, "b", 2, 0.3) == (True, 2)
        await store.renew_shares([(short, "b")], 5)
        await asyncio.sleep(0.6)
        assert await store.shares(short) == 1
        assert await store.claim_share(short, "c", 2, 30) == (True, 2)
        await store.renew_shares([(short, "a")], 30)  # a renewal adds back an entry that had expired
        assert await store.shares(short) == 3

    with_store(store_spec, body)


def test_racing_claims_of_one_client_take_its_share_once(store_spec: str) -> None:
    """Two replicas (here two calls at once) cannot both take a client's last place."""

    async def body(store: SessionStore) -> None:
        group = fresh("race")
        results = await asyncio.gather(*(store.claim_share(group, f"s{i}", 3, 30) for i in range(20)))
        assert sum(counted for counted, _ in results) == 3 and await store.shares(group) == 3

    with_store(store_spec, body)


def test_slot_shares_count_every_replica_and_release_at_the_end(store_spec: str) -> None:
    async def body(store: SessionStore) -> None:
        calls: list[tuple[str, bool]] = []
        one = SlotShares(store, lambda call, _, ok: calls.append((call, ok)))
        two = SlotShares(store, lambda call, _, ok: None)
        group = fresh("replicas")
        first, second = object(), object()
        assert await one.claim(group, "sid-1", 2) is None
        one.count(first, group, "sid-1")
        assert await two.claim(group, "sid-2", 2) is None
        two.count(second, group, "sid-2")
        assert await one.claim(group, "sid-3", 2) == 2  # held through the other replica too
        assert await two.claim(group, "sid-3", 2) == 2
        ended = two.release(second)
        assert ended is not None
        await ended
        assert await one.claim(group, "sid-3", 2) is None
        assert ("claim_share", True) in calls
        await one.close()
        await two.close()

    with_store(store_spec, body)


class Unreachable(MemoryStore):
    """A store whose share calls fail, as a Redis that does not answer."""

    async def claim_share(self, group: str, member: str, limit: int, ttl: float) -> tuple[bool, int]:
        raise StoreUnavailable("session store claim_share: Timeout")

    async def renew_shares(self, entries, ttl) -> None:  # type: ignore[no-untyped-def]
        raise StoreUnavailable("session store renew_shares: Timeout")


def test_without_the_store_this_proxys_own_count_holds() -> None:
    async def body() -> None:
        failures: list[str] = []
        shares = SlotShares(Unreachable(), lambda call, _, ok: None if ok else failures.append(call))
        a, b = object(), object()
        assert await shares.claim("203.0.113.7", "x", 2) is None
        shares.count(a, "203.0.113.7", "x")
        assert await shares.claim("203.0.113.7", "y", 2) is None
        shares.count(b, "203.0.113.7", "y")
        assert await shares.claim("203.0.113.7", "z", 2) == 2  # this proxy's two
        assert await shares.claim("203.0.113.8", "z", 2) is None  # another client
        assert shares.held_here("203.0.113.7") == 2
        shares.release(a)
        assert await shares.claim("203.0.113.7", "z", 2) is None
        await asyncio.sleep(0)  # the renewals ran and failed: sessions go on, counted here
        assert "claim_share" in failures and "renew_shares" in failures
        await shares.close()

    asyncio.run(asyncio.wait_for(body(), 30))


def test_a_paused_store_falls_back_to_the_local_count_and_an_emptied_one_is_filled_again(tmp_path: Path) -> None:
    """A real Redis paused (SIGSTOP): a start's claim answers within one store call, by this
    proxy's own count; resumed and emptied (FLUSHALL, as a restart without its data), the
    renewals write this proxy's entries back and the store counts them again."""
    with serve_redis(tmp_path) as server:
        assert server.proc is not None
        pid = server.proc.pid

        async def body() -> None:
            store = open_store(server.url)
            failures: list[str] = []
            shares = SlotShares(store, lambda call, _, ok: None if ok else failures.append(call))
            a, b = object(), object()
            try:
                assert await shares.claim("198.51.100.4", "s1", 2) is None
                shares.count(a, "198.51.100.4", "s1")
                os.kill(pid, signal.SIGSTOP)
                try:
                    assert await shares.claim("198.51.100.4", "s2", 2) is None  # one here: admitted
                    shares.count(b, "198.51.100.4", "s2")
                    assert await shares.claim("198.51.100.4", "s3", 2) == 2  # two here: refused
                    assert failures.count("claim_share") == 2
                finally:
                    os.kill(pid, signal.SIGCONT)
                client = aioredis.from_url(server.url)
                try:
                    await client.flushall()
                finally:
                    await client.aclose()
                deadline = time.monotonic() + 30
                while await store.shares("198.51.100.4") < 2:  # the next renewal writes both back
                    assert time.monotonic() < deadline, "the entries were not written back"
                    await asyncio.sleep(0.1)
                assert await shares.claim("198.51.100.4", "s3", 2) == 2
            finally:
                await shares.close()
                await store.close()

        asyncio.run(asyncio.wait_for(body(), 60))


def test_a_store_at_its_maxmemory_leaves_the_count_to_each_proxy(tmp_path: Path) -> None:
    """Redis at its `maxmemory` (noeviction) refuses the claim's write: the start is admitted
    by this proxy's own count, never refused for the store's sake, and counted again once the
    store takes writes."""
    with serve_redis(tmp_path) as server:

        async def body() -> None:
            store = open_store(server.url)
            client = aioredis.from_url(server.url)
            failures: list[str] = []
            shares = SlotShares(store, lambda call, _, ok: None if ok else failures.append(call))
            session = object()
            try:
                await client.config_set("maxmemory-policy", "noeviction")
                await client.config_set("maxmemory", 1)
                try:
                    assert await shares.claim("203.0.113.9", "s1", 1) is None  # none here: admitted
                    shares.count(session, "203.0.113.9", "s1")
                    assert await shares.claim("203.0.113.9", "s2", 1) == 1  # this proxy's own count
                    assert "claim_share" in failures
                finally:
                    await client.config_set("maxmemory", 0)
                deadline = time.monotonic() + 30
                while await store.shares("203.0.113.9") < 1:  # the next renewal counts it in the store
                    assert time.monotonic() < deadline, "the entry was not written once the store took writes"
                    await asyncio.sleep(0.1)
            finally:
                await shares.close()
                await client.aclose()
                await store.close()

        asyncio.run(asyncio.wait_for(body(), 60))
