"""The session store's rules (proxy/store), the same for the in-process store and a real Redis server: one
holder at a time (a lease with an expiry and an epoch), writes fenced by the lease, a handoff
asked of a live holder, tokens found by their hash (docs/operations.md "When a proxy dies")."""

from __future__ import annotations

import asyncio

import pytest

from rtvideo.proxy.store.base import Payload, Renewal, SessionGone, SessionStore
from rtvideo.proxy.store.keeper import StoreKeeper
from tests.support.stores import with_store


def test_one_holder_at_a_time_and_a_lost_lease_writes_nothing(store_spec: str) -> None:
    async def body(store: SessionStore) -> None:
        sid = f"s-{store_spec[:5]}-lease"
        await store.drop(sid)
        first = await store.acquire(sid, "replica-a", ttl=0.4)
        assert first is not None and first.epoch >= 1
        assert await store.acquire(sid, "replica-b", ttl=0.4) is None  # held
        assert await store.put(sid, first, {"request_id": "r", "start": "{}"})
        assert await store.append(sid, first, ['e{"prompt": "a"}'], None)
        assert await store.renew(sid, first, ttl=0.4)
        await asyncio.sleep(0.6)  # not renewed: expired
        second = await store.acquire(sid, "replica-b", ttl=5)
        assert second is not None and second.epoch == first.epoch + 1
        # the old holder learns it lost the lease at its next write or renewal, and writes nothing
        assert not await store.append(sid, first, ['e{"prompt": "lost"}'], None)
        assert not await store.renew(sid, first)
        assert await store.append(sid, second, ['f{"n": 3}'], Payload(3, b"\x00three"))
        assert await store.append(sid, second, ['f{"n": 4}'], Payload(4, b"four\xff", forget=(3,)))
        stored = await store.load(sid)
        assert stored is not None and stored.holder == "replica-b" and 0 <= stored.age < 5
        assert stored.fields["request_id"] == "r"
        assert list(stored.log) == ['e{"prompt": "a"}', 'f{"n": 3}', 'f{"n": 4}']  # in order; the lost write is not
        assert dict(stored.payloads) == {4: b"four\xff"}  # binary, and the forgotten one gone
        await store.drop(sid)
        assert await store.load(sid) is None

    with_store(store_spec, body)


def test_racing_takeovers_grant_one_lease(store_spec: str) -> None:
    async def body(store: SessionStore) -> None:
        sid = f"s-{store_spec[:5]}-race"
        await store.drop(sid)
        leases = await asyncio.gather(*(store.acquire(sid, f"replica-{i}", ttl=5) for i in range(8)))
        assert sum(lease is not None for lease in leases) == 1
        await store.drop(sid)

    with_store(store_spec, body)


def test_a_handoff_asked_with_the_live_token_ends_the_holders_renewals(store_spec: str) -> None:
    async def body(store: SessionStore) -> None:
        sid = f"s-{store_spec[:5]}-handoff"
        await store.drop(sid)
        held = await store.acquire(sid, "replica-a", ttl=5)
        assert held is not None and await store.renew(sid, held, resume_hash="r2") is Renewal.RENEWED
        await store.ask_handoff(sid, "r1")  # asked with a token the holder was resumed with meanwhile
        assert await store.renew(sid, held, resume_hash="r2") is Renewal.RENEWED  # that resume lost the race
        assert await store.renew(sid, held, resume_hash="r2") is Renewal.RENEWED
        await store.ask_handoff(sid, "r2")  # asked with the holder's live token: renewed, the holder decides
        assert await store.renew(sid, held, resume_hash="r2") is Renewal.ASKED
        await store.decline_handoff(sid, held, "r2")  # its owner is attached and answers: kept
        assert await store.handoff_declined(sid, "r2") and not await store.handoff_declined(sid, "r1")
        assert await store.renew(sid, held, resume_hash="r2") is Renewal.RENEWED
        await store.ask_handoff(sid, "r2")  # asked again, the owner gone: the holder lets go
        assert await store.renew(sid, held, resume_hash="r2") is Renewal.ASKED
        await store.release(sid, held)
        taken = await store.acquire(sid, "replica-b", ttl=5)
        assert taken is not None and await store.renew(sid, taken)  # the request was for the old holder
        await store.drop(sid)

    with_store(store_spec, body)


def test_tokens_are_found_by_their_hash_only(store_spec: str) -> None:
    async def body(store: SessionStore) -> None:
        await store.bind_token("resume", "ab" * 32, "s-tokens")
        assert await store.find("resume", "ab" * 32) == "s-tokens"
        assert await store.find("watch", "ab" * 32) is None
        await store.unbind_token("resume", "ab" * 32)
        assert await store.find("resume", "ab" * 32) is None

    with_store(store_spec, body)


def test_the_keeper_keeps_the_payloads_of_the_last_chunks_within_its_bound(store_spec: str) -> None:
    async def body(store: SessionStore) -> None:
        sid = f"s-{store_spec[:5]}-payloads"
        await store.drop(sid)
        keeper = StoreKeeper(store, sid, "replica-a", lambda *_: None, payload_bytes=250)
        assert await keeper.start()
        for index in range(6):
            keeper.handed_out(f'{{"i": {index}}}', index, bytes([index]) * 100)
        keeper.handed_out('{"type": "ack"}', None, None)
        await keeper.event(None)  # waits for the writes before it
        stored = await store.load(sid)
        assert stored is not None and len(stored.log) == 7
        assert sorted(stored.payloads) == [4, 5]  # 200 bytes within 250; the newest is always kept
        await keeper.end(forget=True)
        assert await store.load(sid) is None

    with_store(store_spec, body)


def test_the_keeper_writes_an_event_before_it_returns_and_stops_on_a_lost_lease(store_spec: str) -> None:
    async def body(store: SessionStore) -> None:
        sid = f"s-{store_spec[:5]}-keeper"
        await store.drop(sid)
        seen: list[tuple[str, bool]] = []
        keeper = StoreKeeper(store, sid, "replica-a", lambda call, _, ok: seen.append((call, ok)), lease_seconds=0.6)
        assert await keeper.start()
        keeper.bind({"resume": "r1"})
        keeper.put({"request_id": "r"})
        await keeper.event('{"prompt": "a"}')
        stored = await store.load(sid)  # written before event() returned, after the put before it
        assert stored is not None and stored.fields["request_id"] == "r" and list(stored.log) == ['e{"prompt": "a"}']
        await asyncio.sleep(1.0)  # renewed meanwhile (every 0.2 s)
        assert not keeper.lost.is_set() and await store.acquire(sid, "replica-b") is None
        await store.ask_handoff(sid, "r1")
        await asyncio.wait_for(keeper.lost.wait(), 5)  # the holder hears it at its next renewal
        await keeper.event('{"prompt": "after"}')  # given up: returns at once, writes nothing
        await keeper.end(forget=False)
        stored = await store.load(sid)
        assert stored is not None and len(stored.log) == 1
        assert ("write", True) in seen and ("renew", False) not in seen
        await store.drop(sid)

    with_store(store_spec, body)


def test_with_the_store_unreachable_the_keeper_refuses_events_at_once_and_says_so() -> None:
    async def body(store: SessionStore) -> tuple[bool, bool, float, list[tuple[str, bool]]]:
        seen: list[tuple[str, bool]] = []
        keeper = StoreKeeper(store, "s-down", "replica-a", lambda call, _, ok: seen.append((call, ok)))
        began = asyncio.get_running_loop().time()
        claimed = await keeper.start()
        kept = await keeper.event("{}")  # never claimed: not kept (refused with store_unavailable)
        await keeper.end(forget=True)  # one more try to take it, then nothing
        return claimed, kept, asyncio.get_running_loop().time() - began, seen

    claimed, kept, took, seen = with_store("redis://127.0.0.1:1/0", body)  # nothing listens on port 1
    assert not claimed and not kept and took < 10
    assert seen and all(call == "acquire" and not ok for call, ok in seen), seen


def test_a_release_is_told_from_an_expiry_and_a_store_that_lost_the_session_is_not_a_lost_lease(
    store_spec: str,
) -> None:
    async def body(store: SessionStore) -> None:
        sid = f"s-{store_spec[:5]}-released"
        await store.drop(sid)
        held = await store.acquire(sid, "replica-a", ttl=5)
        assert held is not None and await store.put(sid, held, {"request_id": "r"})
        await store.release(sid, held)  # a shutdown hands the session off
        stored = await store.load(sid)
        assert stored is not None and stored.fields.get("released") == "1" and stored.holder is None
        taken = await store.acquire(sid, "replica-b", ttl=5)
        assert taken is not None
        stored = await store.load(sid)
        assert stored is not None and "released" not in stored.fields
        await store.drop(sid)  # the store restarted empty: neither lease nor record
        with pytest.raises(SessionGone):
            await store.renew(sid, taken)  # not a lost lease: the keeper writes the session back

    with_store(store_spec, body)
