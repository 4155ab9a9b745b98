"""An ack is durable, and one replica drives a session, whatever the store does (docs/decisions.md
"The session store under faults"): two real proxies sharing a real `redis-server` that each test
faults its own way (paused with SIGSTOP for longer than the lease, killed, restarted empty, full
at its `maxmemory`, cut off by a TCP relay between the proxies and Redis), the session's real
Triton, real WebSocket clients.

In every case the owner sends interactions before, during and after the fault: each is either
acked and then known to the replica that takes the session over (the same `event_id` with
another payload is `event_id_conflict` there), or answered `store_unavailable` and unknown there
(the same id is new); the video goes on through the fault and no chunk is missing across the
takeover; the session is resumed at one front only and one Triton sequence streams it. Nothing
here times the machine: every wait only bounds a hang."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from rtvideo.client.session import RealtimeVideoClient, RealtimeVideoError
from rtvideo.proxy.app import ProxyServer
from rtvideo.proxy.store.base import LEASE_SECONDS
from tests.support.http_calls import metric_values
from tests.support.proxy_host import ProxyHost, run, wait_idle
from tests.support.redis_server import RedisServer, serve_redis
from tests.support.replica_servers import replica_servers
from tests.support.resume_client import Leg, media_pairs
from tests.support.streams import PACED_MODEL, wait_for_metric
from tests.support.tcp_relay import TcpRelay

PROMPT = "a harbour at night"
FRAMES = 4000  # more than a test reads: it stops the session
SIZE = {"width": 128, "height": 96}
QUEUED, REFUSED = "session.interaction.queued", "store_unavailable"
#: how long a fault lasts: past the lease, so a holder that cannot renew must stop driving
FAULT_SECONDS = LEASE_SECONDS + 2.0
#: bounds a hang only (a retried interaction waits for the store's return)
BACK_SECONDS = 60.0


@dataclass
class Store:
    """One test's own redis-server, reached by the proxies through a relay a test can cut (and
    point at the server again once it is restarted on another port)."""

    server: RedisServer
    relay: TcpRelay
    host: ProxyHost

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.relay.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.server.port, socket_timeout=10)

    def pid(self) -> int:
        """The redis-server process itself (the test's child is its launcher)."""
        return int(self.client().info("server")["process_id"])

    def restart_empty(self) -> None:
        """Started again with nothing in it (no persistence), the relay pointed at it, every
        connection through the relay cut (the proxies reconnect to the new server)."""
        self.server.stop()
        self.server.start()
        self.relay.targets = [self.server.port]
        self.host.call(_cut(self.relay))


async def _cut(relay: TcpRelay) -> None:
    relay.cut()


@pytest.fixture
def store(proxies: ProxyHost, tmp_path: Path) -> Iterator[Store]:
    with serve_redis(tmp_path) as server:
        relay = proxies.call(TcpRelay(server.port).up())
        faulted = Store(server, relay, proxies)
        pid = faulted.pid()
        try:
            yield faulted
        finally:
            with contextlib.suppress(OSError):  # a failed test may leave it paused (or it is gone)
                os.kill(pid, signal.SIGCONT)
            proxies.call(relay.down())


@pytest.fixture
def replicas(proxies: ProxyHost, store: Store) -> Iterator[list[ProxyServer]]:
    """Two proxies of one deployment on the paced model (a session lasts as long as its video)."""
    with replica_servers(proxies, model=PACED_MODEL, session_store=store.url, drain_seconds=5.0) as started:
        yield started


#: a lease short beside the stall's `FAULT_SECONDS`: the holder's recovery and the other front's
#: takeover race once the store is back (either may win: each is what a client may meet)
SHORT_LEASE_SECONDS = 1.5


@pytest.fixture
def short_lease_replicas(proxies: ProxyHost, store: Store) -> Iterator[list[ProxyServer]]:
    """`replicas` with `SHORT_LEASE_SECONDS` leases."""
    with replica_servers(
        proxies, model=PACED_MODEL, session_store=store.url, drain_seconds=5.0, lease_seconds=SHORT_LEASE_SECONDS
    ) as started:
        yield started


async def answer(leg: Leg, event_id: str, prompt: str) -> dict[str, Any]:
    """`event_id` sent with `prompt`: its ack or the error naming it (what comes between is read)."""
    await leg.interact(prompt, event_id)
    while True:
        message = await leg.read(60)
        if message.get("event_id") == event_id and message["type"] in (QUEUED, "error"):
            return message


async def acked_once_back(leg: Leg, event_id: str, prompt: str) -> dict[str, Any]:
    """`event_id` sent again, the same payload, until the store takes it (`store_unavailable`
    until then, as a client retries it)."""
    deadline = time.monotonic() + BACK_SECONDS
    while True:
        got = await answer(leg, event_id, prompt)
        if got["type"] == QUEUED:
            return got
        assert got["code"] == REFUSED, got
        assert time.monotonic() < deadline, "the store came back but interactions are still refused"
        await asyncio.sleep(0.3)


async def media_for(leg: Leg, seconds: float, at_least: int = 2) -> int:
    """Reads on for `seconds` (how long a fault lasts), and until `at_least` media pairs came
    meanwhile (a video that stopped fails the read's own deadline); the media pairs read."""
    before, deadline = len(media_pairs([leg])), time.monotonic() + seconds
    while time.monotonic() < deadline or len(media_pairs([leg])) - before < at_least:
        await leg.read(30)
    return len(media_pairs([leg])) - before


async def _count_live(servers: list[ProxyServer]) -> int:
    return sum(len(server.context.sessions) for server in servers)


async def one_driver(host: ProxyHost, servers: list[ProxyServer]) -> None:
    """Until one session is live on the replicas together (the old holder's end may be under way)."""
    deadline = time.monotonic() + BACK_SECONDS
    while await asyncio.to_thread(host.call, _count_live(servers)) != 1:
        assert time.monotonic() < deadline, "two replicas go on driving the session"
        await asyncio.sleep(0.1)


@dataclass
class Outcome:
    answers: dict[str, dict[str, Any]]  # event id → what its sender was answered (its last try)
    at_takeover: dict[str, dict[str, Any]]  # event id → the answer to another payload under it, after the takeover
    during: int  # media pairs read while the store was faulted
    pairs: list[int]  # the transport indices read, both legs
    old_token_at_first: dict[str, Any]  # the first front's answer to the used token
    refusals: float  # interactions answered store_unavailable at the first front


def faulted_session(
    host: ProxyHost, triton: Any, replicas: list[ProxyServer], begin: Callable[[], None], end: Callable[[], None]
) -> Outcome:
    """A session at the first replica through the fault `begin` … `end` (interactions before, in
    it, once the store is back), then its owner's link drops and it resumes at the second."""
    wait_idle(triton, PACED_MODEL)
    a, b = replicas

    async def body() -> Outcome:
        first = await Leg.open(a.url)
        start = await first.start(PROMPT, num_frames=FRAMES, seed=21, **SIZE)
        assert start["type"] == "video.start" and start["resume_token"], start
        await first.media(2)
        answers = {"before": await answer(first, "before", "a storm")}
        assert answers["before"]["type"] == QUEUED, answers
        await asyncio.to_thread(begin)
        try:
            answers["early"] = await answer(first, "early", "rain")  # may have beaten the fault
            during = await media_for(first, FAULT_SECONDS)
            answers["late"] = await answer(first, "late", "snow")
        finally:
            await asyncio.to_thread(end)
        answers["after"] = await acked_once_back(first, "after", "fog")
        await first.media(2)
        first.drop()
        second, resumed = await Leg.resumed(b.url, start["resume_token"], first.last_index)
        assert resumed["type"] == "video.start" and resumed["resumed"] is True, resumed
        assert resumed["request_id"] == start["request_id"]
        at_takeover = {event_id: await answer(second, event_id, "another payload") for event_id in answers}
        await one_driver(host, [a, b])
        await asyncio.to_thread(wait_for_metric, triton, "rtvideo_active_sessions", PACED_MODEL, 1, 30)
        again = await Leg.open(a.url)
        old_token = await again.resume(start["resume_token"], first.last_index)
        await again.conn.close()
        await second.media(2)
        await second.send({"type": "session.stop"})
        await second.until("session.done", timeout=60)
        indices = [m["transport_chunk_index"] for m, _ in media_pairs([first, second])]
        refusals = metric_values(a.port).get("rtvideo_proxy_store_refusals_total", 0.0)
        return Outcome(answers, at_takeover, during, indices, old_token, refusals)

    return run(body(), timeout=300)


def check(outcome: Outcome) -> None:
    """The invariants every fault keeps (module docstring)."""
    for event_id, given in outcome.answers.items():
        later = outcome.at_takeover[event_id]
        if given["type"] == QUEUED:  # acked: where the takeover reads it
            assert later["type"] == "error" and later["code"] == "event_id_conflict", (event_id, given, later)
        else:  # refused: never admitted, so the same id is new there
            assert given["code"] == REFUSED, given
            assert later["type"] == QUEUED, (event_id, given, later)
    assert outcome.answers["late"]["type"] == "error", outcome.answers  # the store was away: never acked
    assert outcome.refusals >= 1
    assert outcome.during >= 2  # the video went on while the store was away
    assert outcome.pairs == list(range(len(outcome.pairs)))  # no chunk missing, none twice
    assert outcome.old_token_at_first["type"] == "error", outcome.old_token_at_first
    assert outcome.old_token_at_first["code"] == "invalid_resume"


def test_a_store_paused_past_the_lease(
    proxies: ProxyHost, triton: Any, store: Store, replicas: list[ProxyServer]
) -> None:
    pid = store.pid()
    outcome = faulted_session(
        proxies, triton, replicas, lambda: os.kill(pid, signal.SIGSTOP), lambda: os.kill(pid, signal.SIGCONT)
    )
    check(outcome)


def test_a_store_killed_and_started_again_empty(
    proxies: ProxyHost, triton: Any, store: Store, replicas: list[ProxyServer]
) -> None:
    def kill() -> None:
        os.kill(store.pid(), signal.SIGKILL)
        store.server.stop()  # its launcher gone too

    def start_again() -> None:
        store.server.start()
        store.relay.targets = [store.server.port]

    check(faulted_session(proxies, triton, replicas, kill, start_again))


def test_a_store_full_at_its_maxmemory(
    proxies: ProxyHost, triton: Any, store: Store, replicas: list[ProxyServer]
) -> None:
    client = store.client()

    def fill() -> None:  # every write that may grow it is refused (OOM), as at a real bound
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", 1)

    check(faulted_session(proxies, triton, replicas, fill, lambda: client.config_set("maxmemory", 0)))


def test_the_network_to_the_store_cut(
    proxies: ProxyHost, triton: Any, store: Store, replicas: list[ProxyServer]
) -> None:
    relay = store.relay
    check(
        faulted_session(proxies, triton, replicas, lambda: proxies.call(relay.down()), lambda: proxies.call(relay.up()))
    )


def test_a_store_restarted_empty_ends_nothing(
    proxies: ProxyHost, triton: Any, store: Store, replicas: list[ProxyServer]
) -> None:
    """Restarted at once, empty: the holder writes its sessions back (record, log, token bindings)
    and they go on where they are; the owner's link is never closed for it, and the session is
    resumable at the other replica afterwards."""
    outcome = faulted_session(proxies, triton, replicas, store.restart_empty, lambda: None)
    for event_id in ("before", "after"):
        assert outcome.at_takeover[event_id]["code"] == "event_id_conflict", outcome.at_takeover
    assert outcome.pairs == list(range(len(outcome.pairs)))
    assert outcome.old_token_at_first["code"] == "invalid_resume"


def test_a_resume_at_the_same_front_after_a_long_stall_goes_on_once(
    proxies: ProxyHost, triton: Any, store: Store, replicas: list[ProxyServer]
) -> None:
    """The owner's link drops while the store is paused past the lease; once it is back the owner
    resumes at the same front, which checks its lease in the store first and goes on (not "the
    session has ended"); the same token at the other front is then refused; one sequence."""
    wait_idle(triton, PACED_MODEL)
    a, b = replicas
    pid = store.pid()

    async def body() -> tuple[dict[str, Any], dict[str, Any], list[int]]:
        first = await Leg.open(a.url)
        start = await first.start(PROMPT, num_frames=FRAMES, seed=22, **SIZE)
        await first.media(2)
        assert (await answer(first, "before", "a storm"))["type"] == QUEUED
        os.kill(pid, signal.SIGSTOP)
        try:
            await media_for(first, 1.0)
            first.drop()
            await asyncio.sleep(FAULT_SECONDS)
        finally:
            os.kill(pid, signal.SIGCONT)
        second, resumed = await Leg.resumed(a.url, start["resume_token"], first.last_index)
        deadline = time.monotonic() + BACK_SECONDS
        while resumed.get("code") == "invalid_resume" and "resume again" in resumed.get("message", ""):
            assert time.monotonic() < deadline, resumed  # the store not confirmed yet: the client retries
            await second.conn.close()
            await asyncio.sleep(0.3)
            second, resumed = await Leg.resumed(a.url, start["resume_token"], first.last_index)
        assert resumed["type"] == "video.start", resumed
        await second.media(2)
        conflict = await answer(second, "before", "another payload")
        elsewhere = await Leg.open(b.url)
        refused = await elsewhere.resume(start["resume_token"], first.last_index)
        await elsewhere.conn.close()
        await one_driver(proxies, [a, b])
        await asyncio.to_thread(wait_for_metric, triton, "rtvideo_active_sessions", PACED_MODEL, 1, 30)
        await second.send({"type": "session.stop"})
        await second.until("session.done", timeout=60)
        return conflict, refused, [m["transport_chunk_index"] for m, _ in media_pairs([first, second])]

    conflict, refused, pairs = run(body(), timeout=300)
    assert conflict["code"] == "event_id_conflict", conflict
    assert refused["type"] == "error" and refused["code"] == "invalid_resume", refused
    assert pairs == list(range(len(pairs)))  # no chunk missing, none twice


def test_a_resume_at_another_replica_while_the_owner_answers_is_refused(
    proxies: ProxyHost, triton: Any, store: Store, replicas: list[ProxyServer]
) -> None:
    """The owner is attached at the first replica and answers; its token is used at the second:
    refused as one proxy refuses it (docs/protocol.md §9.1), and the session goes on untouched."""
    wait_idle(triton, PACED_MODEL)
    a, b = replicas

    async def body() -> tuple[dict[str, Any], list[int]]:
        first = await Leg.open(a.url)
        start = await first.start(PROMPT, num_frames=FRAMES, seed=23, **SIZE)
        await first.media(2)
        elsewhere = await Leg.open(b.url)
        refused = await elsewhere.resume(start["resume_token"], first.last_index)
        await elsewhere.conn.close()
        await first.media(2)  # still the owner, still streaming
        assert (await answer(first, "after", "fog"))["type"] == QUEUED
        await one_driver(proxies, [a, b])
        await first.send({"type": "session.stop"})
        await first.until("session.done", timeout=60)
        return refused, [m["transport_chunk_index"] for m, _ in media_pairs([first])]

    refused, pairs = run(body(), timeout=180)
    assert refused["type"] == "error" and refused["code"] == "invalid_resume", refused
    assert "attached to another connection" in refused["message"], refused
    assert pairs == list(range(len(pairs)))


def test_a_resume_at_the_other_front_after_a_long_stall_goes_on_once(
    proxies: ProxyHost, triton: Any, store: Store, short_lease_replicas: list[ProxyServer]
) -> None:
    """The owner's link drops while the store is paused past the (short) lease, after its front
    handed out chunks the store never got; once the store is back the owner resumes at the other
    front (refused while the record there is behind, as a client retries), which takes the session
    over whole once its holder wrote it back, or takes the record as the stall left it when it
    gets the lease first (within the chunks in flight; the holder then lets go): `before`'s ack
    may be missing there, its event is not, and it stays acked (issue 48: answered as new). The
    same token at the first front is refused then, and one sequence streams (issue 46: both
    fronts streamed it)."""
    wait_idle(triton, PACED_MODEL)
    a, b = short_lease_replicas
    pid = store.pid()

    async def body() -> tuple[dict[str, Any], dict[str, Any], list[int]]:
        first = await Leg.open(a.url)
        start = await first.start(PROMPT, num_frames=FRAMES, seed=24, **SIZE)
        await first.media(2)
        assert (await answer(first, "before", "a storm"))["type"] == QUEUED
        os.kill(pid, signal.SIGSTOP)
        try:
            await media_for(first, 1.0)  # handed out while the store could not take them
            first.drop()
            await asyncio.sleep(FAULT_SECONDS)
        finally:
            os.kill(pid, signal.SIGCONT)
        deadline = time.monotonic() + BACK_SECONDS
        while True:
            second, resumed = await Leg.resumed(b.url, start["resume_token"], first.last_index)
            if resumed["type"] == "video.start":
                break
            assert resumed.get("code") == "invalid_resume", resumed
            assert time.monotonic() < deadline, resumed
            await second.conn.close()
            await asyncio.sleep(0.3)
        await second.media(2)
        conflict = await answer(second, "before", "another payload")
        again = await Leg.open(a.url)
        refused = await again.resume(start["resume_token"], first.last_index)
        await again.conn.close()
        await one_driver(proxies, [a, b])
        await asyncio.to_thread(wait_for_metric, triton, "rtvideo_active_sessions", PACED_MODEL, 1, 30)
        await second.send({"type": "session.stop"})
        await second.until("session.done", timeout=60)
        return conflict, refused, [m["transport_chunk_index"] for m, _ in media_pairs([first, second])]

    conflict, refused, pairs = run(body(), timeout=300)
    assert conflict["code"] == "event_id_conflict", conflict
    assert refused["type"] == "error" and refused["code"] == "invalid_resume", refused
    assert pairs == list(range(len(pairs)))  # no chunk missing, none twice


def test_a_session_that_is_not_resumable_is_acked_while_the_store_is_paused(
    proxies: ProxyHost, triton: Any, store: Store
) -> None:
    """A start with `"resumable": false` promises no continuation: its interactions are acked
    without the store (docs/decisions.md "The session store under faults"), while a resumable
    session beside it at the same replica is refused `store_unavailable` until the store is
    back. Its token bindings are still kept while the store is there (its guests at the other
    replica find it by them)."""
    wait_idle(triton, PACED_MODEL)
    pid = store.pid()

    def bindings() -> list[bytes]:
        return list(store.client().scan_iter("rtvideo:k:*"))

    async def body() -> None:
        plain = await Leg.open(a.url)
        started = await plain.start(PROMPT, num_frames=FRAMES, seed=5, resumable=False, watchable=True, **SIZE)
        assert started["type"] == "video.start" and not started.get("resume_token"), started
        await plain.media(1)
        deadline = time.monotonic() + BACK_SECONDS
        while not await asyncio.to_thread(bindings):  # its watch token's binding, written after the start
            assert time.monotonic() < deadline, "a session that is not resumable has no token binding"
            await asyncio.sleep(0.1)
        durable = await Leg.open(a.url)
        resumable = await durable.start(PROMPT, num_frames=FRAMES, seed=6, **SIZE)
        assert resumable["type"] == "video.start" and resumable["resume_token"], resumable
        await durable.media(1)
        assert (await answer(durable, "before", "a storm"))["type"] == QUEUED
        os.kill(pid, signal.SIGSTOP)
        try:
            for n in range(3):  # acked at once, however long the store is away
                got = await answer(plain, f"plain-{n}", "rain")
                assert got["type"] == QUEUED, got
            refused = await answer(durable, "durable", "rain")
            assert refused["type"] == "error" and refused["code"] == REFUSED, refused
            await media_for(plain, 1.0)
        finally:
            os.kill(pid, signal.SIGCONT)
        assert (await acked_once_back(durable, "durable", "rain"))["type"] == QUEUED
        assert (await answer(plain, "plain-after", "fog"))["type"] == QUEUED
        for leg in (plain, durable):
            await leg.send({"type": "session.stop"})
            await leg.until("session.done", timeout=60)

    # one client address, two sessions side by side
    settings = {"model": PACED_MODEL, "session_store": store.url, "max_sessions_per_client": 2}
    with replica_servers(proxies, count=1, **settings) as (a,):
        run(body(), timeout=300)


async def _client_session(url: str, seed: int) -> RealtimeVideoClient:
    client = RealtimeVideoClient(url)
    await client.__aenter__()
    start = await client.start(PROMPT, num_frames=FRAMES, seed=seed, **SIZE)
    assert start["resume_token"], start
    async for _ in client.chunks():  # one chunk: the session streams
        break
    return client


async def _stop(client: RealtimeVideoClient) -> None:
    await client.stop()
    async for _ in client.chunks():
        pass
    await client.__aexit__(None, None, None)


def test_the_client_sends_again_until_the_paused_store_is_back(
    proxies: ProxyHost, triton: Any, store: Store, replicas: list[ProxyServer]
) -> None:
    """rtvideo.client's `interact` sends an interaction refused `store_unavailable` again with
    the same event id: the store paused, then continued within the client's retry window (10 s),
    the call returns the ack (the proxy refused it at least once meanwhile)."""
    wait_idle(triton, PACED_MODEL)
    a = replicas[0]
    pid = store.pid()

    async def body() -> None:
        client = await _client_session(a.url, 31)
        refused_before = metric_values(a.port).get("rtvideo_proxy_store_refusals_total", 0.0)
        os.kill(pid, signal.SIGSTOP)
        loop = asyncio.get_running_loop()
        back = loop.call_later(3.0, os.kill, pid, signal.SIGCONT)
        try:
            ack = await asyncio.wait_for(client.interact("rain", event_id="while-paused"), BACK_SECONDS)
        finally:
            back.cancel()
            os.kill(pid, signal.SIGCONT)
        assert ack["type"] == QUEUED and ack["event_id"] == "while-paused", ack
        assert metric_values(a.port).get("rtvideo_proxy_store_refusals_total", 0.0) > refused_before
        assert client.errors.empty(), client.errors  # the refusals were the call's to retry
        await _stop(client)

    run(body(), timeout=300)


def test_the_client_gives_up_with_a_clear_error_when_the_store_stays_away(
    proxies: ProxyHost, triton: Any, store: Store, replicas: list[ProxyServer]
) -> None:
    """A store that does not come back within the retry window: `interact` raises
    `store_unavailable` (the interaction was never applied), and the session goes on."""
    wait_idle(triton, PACED_MODEL)
    a = replicas[0]
    pid = store.pid()

    async def body() -> None:
        client = await _client_session(a.url, 32)
        os.kill(pid, signal.SIGSTOP)
        try:
            with pytest.raises(RealtimeVideoError) as refused:
                await asyncio.wait_for(client.interact("rain", event_id="never-kept"), BACK_SECONDS)
            assert refused.value.code == REFUSED and refused.value.event_id == "never-kept"
            assert "10 s" in refused.value.message, refused.value.message
            async for _ in client.chunks():  # the video goes on
                break
        finally:
            os.kill(pid, signal.SIGCONT)
        await _stop(client)

    run(body(), timeout=300)
