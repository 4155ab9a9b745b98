"""Where a guest's session is, for a replica that does not hold it (rtvideo.proxy.edge.relay),
the same with the in-process store and a real Redis server: each proxy's advertised address
(renewed, expiring, withdrawn), a session's holder without its log, and what a guest door
makes of them."""

from __future__ import annotations

import asyncio
import secrets

from rtvideo.proxy.continuity.record import token_hash
from rtvideo.proxy.edge.relay import Where, hop_url, locate
from rtvideo.proxy.store.base import LEASE_SECONDS, SessionStore
from tests.support.stores import with_store


def test_an_address_lives_while_it_is_renewed_and_goes_when_withdrawn(store_spec: str) -> None:
    async def body(store: SessionStore) -> None:
        holder = f"proxy-{secrets.token_hex(4)}"
        assert await store.address(holder) is None  # never advertised
        await store.advertise(holder, "http://10.0.0.7:8080", 0.4)
        assert await store.address(holder) == "http://10.0.0.7:8080"
        await asyncio.sleep(0.25)
        await store.advertise(holder, "http://10.0.0.7:8080", 0.4)  # renewed before it ran out
        await asyncio.sleep(0.25)
        assert await store.address(holder) == "http://10.0.0.7:8080"
        await asyncio.sleep(0.3)  # not renewed: a proxy that died is no longer advertised
        assert await store.address(holder) is None
        await store.advertise(holder, "http://10.0.0.8:8080", 30)
        assert await store.address(holder) == "http://10.0.0.8:8080"  # the latest address wins
        await store.advertise(holder, "http://10.0.0.8:8080", 0)  # a proxy that stops withdraws it
        assert await store.address(holder) is None
        assert await store.address("another-proxy") is None

    with_store(store_spec, body)


def test_holding_names_the_live_holder_without_the_log(store_spec: str) -> None:
    async def body(store: SessionStore) -> None:
        sid = f"s-{secrets.token_hex(4)}"
        assert await store.holding(sid) is None
        lease = await store.acquire(sid, "replica-a", ttl=5)
        assert lease is not None
        assert await store.put(sid, lease, {"request_id": "r"})
        held = await store.holding(sid)
        assert held is not None and held.holder == "replica-a" and 0 <= held.age < 5
        await store.release(sid, lease)  # handed off: kept, held by nobody
        held = await store.holding(sid)
        assert held is not None and held.holder is None
        await store.drop(sid)
        assert await store.holding(sid) is None

    with_store(store_spec, body)


def test_a_guest_door_finds_where_its_session_is(store_spec: str) -> None:
    """Nowhere for a token the store never saw; here; elsewhere at the holder's address; moving
    while nobody holds it within the grace (or its holder advertises no address); nowhere past
    the grace."""

    async def body(store: SessionStore) -> None:
        sid = f"s-{secrets.token_hex(4)}"
        token = f"wv1.{store.cluster}.{secrets.token_urlsafe(32)}"
        assert (await locate(store, "watch", token, "replica-b", 30, settle=0)).where is Where.NOWHERE
        lease = await store.acquire(sid, "replica-a", ttl=5)
        assert lease is not None and await store.put(sid, lease, {"request_id": "r"})
        await store.bind_token("watch", token_hash(token), sid)
        assert (await locate(store, "steer", token, "replica-b", 30, settle=0)).where is Where.NOWHERE  # another kind
        assert (await locate(store, "watch", token, "replica-a", 30)).where is Where.HERE
        assert (await locate(store, "watch", token, "replica-b", 30)).where is Where.MOVING  # no address yet
        await store.advertise("replica-a", "http://127.0.0.1:9001", 5)
        found = await locate(store, "watch", token, "replica-b", 30)
        assert found.where is Where.ELSEWHERE and found.url == "http://127.0.0.1:9001"
        await store.release(sid, lease)
        assert (await locate(store, "watch", token, "replica-b", 30)).where is Where.MOVING
        # its owner had the grace to resume it, and the lease's length besides: over, it is gone
        assert (await locate(store, "watch", token, "replica-b", -LEASE_SECONDS - 1)).where is Where.NOWHERE
        await store.drop(sid)
        assert (await locate(store, "watch", token, "replica-b", 30, settle=0)).where is Where.NOWHERE
        await store.advertise("replica-a", "", 0)

    with_store(store_spec, body)


def test_the_hop_goes_to_the_same_door_at_the_advertised_address() -> None:
    assert hop_url("http://10.1.2.3:8080", "/v1/realtime/video/watch", "watch_token=a%2Bb") == (
        "ws://10.1.2.3:8080/v1/realtime/video/watch?watch_token=a%2Bb"
    )
    assert hop_url("https://[fd00::5]:8443/", "/v1/realtime/video/steer", "steer_token=x").startswith(
        "wss://[fd00::5]:8443/v1/realtime/video/steer?"
    )


def test_a_token_bound_a_moment_after_the_guest_asked_is_found(store_spec: str) -> None:
    """The holder binds a session's tokens just after its video.start went out: a guest at another
    replica that asks first is looked for again for a moment, not refused as unknown; a token
    still unbound after the moment is unknown."""

    async def body(store: SessionStore) -> None:
        sid = f"s-{secrets.token_hex(4)}"
        token = f"wv1.{store.cluster}.{secrets.token_urlsafe(32)}"
        lease = await store.acquire(sid, "replica-a", ttl=5)
        assert lease is not None and await store.put(sid, lease, {"request_id": "r"})
        await store.advertise("replica-a", "http://127.0.0.1:9001", 5)

        async def bind_late() -> None:
            await asyncio.sleep(0.3)
            await store.bind_token("watch", token_hash(token), sid)

        binding = asyncio.ensure_future(bind_late())
        found = await locate(store, "watch", token, "replica-b", 30, settle=5)
        await binding
        assert found.where is Where.ELSEWHERE and found.url == "http://127.0.0.1:9001"
        loop = asyncio.get_running_loop()
        began = loop.time()
        unbound = f"wv1.{store.cluster}.{secrets.token_urlsafe(32)}"
        assert (await locate(store, "watch", unbound, "replica-b", 30, settle=0.3)).where is Where.NOWHERE
        assert loop.time() - began >= 0.3  # looked for again until the moment was over
        await store.drop(sid)
        await store.advertise("replica-a", "", 0)

    with_store(store_spec, body)
