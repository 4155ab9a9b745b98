"""Watchers and steerers across replicas (docs/decisions.md "Watchers and steerers across
replicas"): two real proxies sharing a real Redis in front of the session's real Triton, the
real Python watch and steer clients, real PyAV decoding. A guest link that reaches the replica
which does not hold its session is forwarded to the one that does; when that one hands the
session off, its guests come back by themselves and go on where the session went; a session on
its way gets 503 with Retry-After; forged tokens, a guest that never reads and a hop that dies
harm no one."""

from __future__ import annotations

import asyncio
import socket
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from rtvideo.client.steer import SteerClient
from rtvideo.client.watch import GuestLink, WatchClient, watch_url
from rtvideo.proxy.app import ProxyServer
from rtvideo.proxy.continuity.record import token_hash
from rtvideo.proxy.store import open_store
from rtvideo.triton.server import free_port
from tests.support.proxy_host import ProxyHost, run, wait_idle
from tests.support.replica_servers import replica_servers
from tests.support.resume_client import NO_KEEPALIVE, Leg
from tests.support.streams import decode
from tests.support.tcp_relay import TcpRelay

PROMPT = "a lantern festival over a river"
FRAMES = 100_000  # more than the tests read: they stop the session
#: B's bound on what waits toward one guest: small, so that a guest that never reads is dropped soon
B_GUEST_BUFFER = 64 * 1024


@dataclass
class Deployment:
    """Two replicas of one deployment; A is advertised to B through a TCP relay a test can cut
    (the network between replicas goes, or A dies, as the relayed guests see it)."""

    a: ProxyServer
    b: ProxyServer
    a_hop: TcpRelay
    store: str  # the store's URL


@pytest.fixture
def deployment(proxies: ProxyHost, redis_url: str) -> Iterator[Deployment]:
    a_port = free_port()
    hop = TcpRelay(a_port)
    proxies.call(hop.up())
    try:
        each = [
            {"port": a_port, "advertise_url": f"http://127.0.0.1:{hop.port}"},
            {"watcher_buffer_bytes": B_GUEST_BUFFER},
        ]
        with replica_servers(proxies, each=each, session_store=redis_url, drain_seconds=5.0) as (a, b):
            yield Deployment(a, b, hop, redis_url)
    finally:
        proxies.call(hop.down())


@dataclass
class Heard:
    """What one guest client handed out, as it came."""

    link: GuestLink
    messages: list[dict[str, Any]] = field(default_factory=list)
    pairs: list[tuple[dict[str, Any], bytes]] = field(default_factory=list)
    task: asyncio.Task[None] | None = None

    @classmethod
    async def join(cls, link: GuestLink) -> Heard:
        await link.__aenter__()
        heard = cls(link)
        heard.task = asyncio.ensure_future(heard._read())
        return heard

    async def _read(self) -> None:
        async for message, payload in self.link.messages():
            self.messages.append(message)
            if payload is not None:
                self.pairs.append((message, payload))

    def media(self) -> list[int]:
        return [m["transport_chunk_index"] for m, _ in self.pairs if m["kind"] == "media"]

    async def until(self, test: Any, timeout: float = 60.0) -> None:
        async def wait() -> None:
            while not test():
                assert self.task is not None and not self.task.done(), self.messages[-3:]
                await asyncio.sleep(0.02)

        await asyncio.wait_for(wait(), timeout)

    async def close(self) -> None:
        await self.link.__aexit__(None, None, None)
        if self.task is not None:
            await asyncio.wait_for(self.task, 10)


async def _bound(store_url: str, start: dict[str, Any]) -> None:
    """Until the store finds the session by its guest tokens: the holder writes their hashes
    just after its video.start goes out, and a link that comes before is an unknown token."""
    store = open_store(store_url)
    try:
        for kind in ("watch", "steer"):
            if f"{kind}_token" in start:
                while await store.find(kind, token_hash(start[f"{kind}_token"])) is None:
                    await asyncio.sleep(0.02)
    finally:
        await store.close()


async def _read_on(leg: Leg) -> None:
    """The owner reads all along, until its connection closes."""
    try:
        while True:
            await leg.read(60)
    except Exception:  # noqa: BLE001 - the close (or the test's end) ends the read
        return


def _started(leg: Leg, event_id: str) -> bool:
    return any(event_id in (m.get("started_event_ids") or ()) for m in leg.messages)


def _acked(heard: Heard, event_id: str) -> bool:
    return any(m["type"] == "session.interaction.queued" and m.get("event_id") == event_id for m in heard.messages)


def _stream(pairs: list[tuple[dict[str, Any], bytes]]) -> bytes:
    """The init payload, then the media payloads: what a fresh decoder needs."""
    init = next(d for m, d in pairs if m["kind"] == "init")
    return init + b"".join(d for m, d in pairs if m["kind"] == "media")


def _sample(server: ProxyServer, name: str, labels: dict[str, str] | None = None) -> float:
    return server.context.metrics.registry.get_sample_value(name, labels or {}) or 0.0


async def _refusal(url: str) -> tuple[int, str, str | None]:
    """The HTTP answer to a guest link's upgrade that is refused: status, reason, Retry-After."""
    with pytest.raises(InvalidStatus) as refused:
        await connect(url, **NO_KEEPALIVE)
    response = refused.value.response
    return response.status_code, response.reason_phrase, response.headers.get("Retry-After")


def test_guests_follow_their_session_across_replicas_and_a_handoff(
    proxies: ProxyHost, triton: Any, deployment: Deployment
) -> None:
    wait_idle(triton)
    a, b = deployment.a, deployment.b

    async def body() -> None:
        owner = await Leg.open(a.url)
        start = await owner.start(PROMPT, seed=41, num_frames=FRAMES, watchable=True, steerable=True)
        assert start["type"] == "video.start" and start["resume_token"], start
        reading = asyncio.ensure_future(_read_on(owner))

        await _bound(deployment.store, start)
        while len(owner.pairs) < 3:  # joined mid-stream: the watcher's stream starts at an init pair
            await asyncio.sleep(0.02)
        # (a) a watcher and a steerer whose links reach B join the session A holds
        watcher = await Heard.join(WatchClient(b.url, start["watch_token"]))
        steerer = await Heard.join(SteerClient(b.url, start["steer_token"]))
        await watcher.until(lambda: len(watcher.media()) >= 3)
        first = watcher.messages[0]
        assert first["type"] == "video.start" and first["watcher"] is True
        assert first["request_id"] == start["request_id"] and "watch_token" not in first
        assert watcher.pairs[0][0]["kind"] == "init"
        assert len(decode(_stream(watcher.pairs))) > 0  # one stream, from the init pair on
        assert b.relays.count("watch") == 1 and b.relays.count("steer") == 1  # relayed, not held at B
        assert _sample(a, "rtvideo_proxy_watchers") == 1 and _sample(a, "rtvideo_proxy_steerers") == 1
        await steerer.until(lambda: bool(steerer.messages))
        assert steerer.messages[0]["steerer"] is True
        assert isinstance(steerer.link, SteerClient)
        await steerer.link.update_prompt("paper boats in the rain", event_id="s1", transition_chunks=1)
        await steerer.until(lambda: _acked(steerer, "s1"))
        while not _started(owner, "s1"):  # the steer, sent through B, in the owner's chunks at A
            await asyncio.sleep(0.02)
        before = watcher.media()[-1]

        # (b) A hands the session off; (c) until its owner resumes, nobody holds it: 503, retry
        handed = asyncio.wrap_future(asyncio.run_coroutine_threadsafe(a.drain(0.0), proxies.loop))
        await asyncio.wait_for(reading, 30)
        assert owner.conn.close_code == 1012, owner.conn.close_code
        await handed
        status, reason, retry = await _refusal(watch_url(b.url, start["watch_token"]))
        assert (status, retry) == (503, "1") and "moving to another proxy" in reason, (status, reason, retry)
        second, resumed = await Leg.resumed(b.url, start["resume_token"], owner.last_index)
        assert resumed["type"] == "video.start" and resumed["resumed"] is True, resumed
        reading = asyncio.ensure_future(_read_on(second))

        # the guests came back by themselves, at B, which now holds the session and knows their tokens
        await watcher.until(lambda: watcher.link.rejoins >= 1 and len([i for i in watcher.media() if i > before]) >= 3)
        await steerer.until(lambda: steerer.link.rejoins >= 1)
        assert b.relays.count("watch") == 0 and _sample(b, "rtvideo_proxy_watchers") == 1
        after = [(m, d) for m, d in watcher.pairs if m["kind"] != "media" or m["transport_chunk_index"] > before]
        assert len(decode(_stream(after))) > 0
        media = watcher.media()
        assert media == sorted(set(media))  # nothing handed out twice across the rejoin
        assert [m for m in watcher.messages if m["type"] == "video.start"] == [first]  # the rejoin is hidden
        await steerer.link.update_prompt("a calm dawn", event_id="s2", transition_chunks=1)
        await steerer.until(lambda: _acked(steerer, "s2"))  # acked at B
        while not _started(second, "s2"):
            await asyncio.sleep(0.02)
        assert not [m for m in watcher.messages + steerer.messages if m["type"] == "error"]

        await second.send({"type": "session.stop"})
        await watcher.until(lambda: watcher.link.done is not None)  # session.done reaches the guests
        await steerer.until(lambda: steerer.link.done is not None)
        await asyncio.wait_for(reading, 60)
        await watcher.close()
        await steerer.close()

    run(body(), timeout=240)


def test_forged_tokens_a_guest_that_never_reads_and_a_dying_hop(
    proxies: ProxyHost, triton: Any, deployment: Deployment
) -> None:
    wait_idle(triton)
    a, b = deployment.a, deployment.b
    alone = proxies.server()  # one proxy, no shared store: the refusal to match

    async def body() -> None:
        # forged tokens are refused at B exactly as on one proxy, whatever they look like
        for door, kind in (("watch", "wv1"), ("steer", "sv1")):
            for forged in (f"{kind}.shared.{'A' * 43}", f"{kind}.x.y", "nonsense", ""):
                query = f"/{door}?{door}_token={urllib.parse.quote(forged)}"
                here, there = await _refusal(b.url + query), await _refusal(alone.url + query)
                assert here == there and here[0] == 403, (forged, here, there)
        assert b.relays.count("watch") == b.relays.count("steer") == 0

        owner = await Leg.open(a.url)
        start = await owner.start(PROMPT, seed=43, num_frames=FRAMES, watchable=True)
        reading = asyncio.ensure_future(_read_on(owner))
        await _bound(deployment.store, start)
        good = await Heard.join(WatchClient(b.url, start["watch_token"]))

        # a relayed guest that never reads: dropped at B, its bytes bounded there; A is not slowed
        stuck = socket.socket()
        stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stuck.connect(("127.0.0.1", b.port))
        path = "/v1/realtime/video/watch?watch_token=" + urllib.parse.quote(start["watch_token"])
        stuck.sendall(
            (
                f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{b.port}\r\nUpgrade: websocket\r\n"
                "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        )
        while _sample(b, "rtvideo_proxy_watchers_dropped_total") < 1:
            assert good.task is not None and not good.task.done()
            await asyncio.sleep(0.05)
        largest = max(len(d) for _, d in good.pairs)
        assert b.relays.peak_pending <= B_GUEST_BUFFER + largest, (b.relays.peak_pending, largest)
        assert _sample(a, "rtvideo_proxy_watchers_dropped_total") == 0  # the relay kept reading A
        while b.relays.count("watch") != 1 or _sample(a, "rtvideo_proxy_watchers") != 1:
            await asyncio.sleep(0.05)  # the stuck guest's hop closed: A let go of it
        stuck.close()

        # the hop to A dies under a relayed guest: closed with 1012, and a client comes back
        raw = await Leg.open(watch_url(b.url, start["watch_token"]))
        await raw.read()
        count = len(good.media())
        await good.until(lambda: len(good.media()) > count)
        deployment.a_hop.cut()
        try:
            while True:
                await raw.read(30)
        except Exception:  # noqa: BLE001 - the close ends the read
            pass
        assert raw.conn.close_code == 1012, raw.conn.close_code
        await good.until(lambda: good.link.rejoins >= 1)
        count = len(good.media())
        await good.until(lambda: len(good.media()) >= count + 3)  # on again, through a new hop
        assert not [m for m in good.messages if m["type"] == "error"]

        await owner.send({"type": "session.stop"})
        await good.until(lambda: good.link.done is not None)
        await asyncio.wait_for(reading, 60)
        await good.close()

    run(body(), timeout=240)
