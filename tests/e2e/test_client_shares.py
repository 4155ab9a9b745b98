"""Shared limits per client (docs/security.md "What one client may cost the others"), tried through real proxies,
the session's real Triton, real WebSocket clients and, across replicas, a real Redis:

- the waiting share is held per client: one address flooding upgrades that never start does
  not refuse another address, and a burst of one address's clients that each start at once
  is not refused;
- addresses are grouped by network (an IPv6 client holds a /64), here through the trusted
  X-Forwarded-For path (this machine's only IPv6 loopback address is ::1);
- the share of model slots counts a client's sessions on every replica of a shared store;
- a start with an unknown field past the bounds is refused before it is recorded or forwarded.

No timing assertion: deadlines only bound hangs."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from rtvideo.proxy.app import ProxyServer
from rtvideo.proxy.observability.metrics import by_label
from tests.support.proxy_client import ws
from tests.support.proxy_host import run, wait_idle
from tests.support.streams import PACED_MODEL

pytestmark = pytest.mark.triton

PROMPT = "paper boats on a pond"


def awaiting_start_refusals(server: ProxyServer) -> float:
    return by_label(server.context.metrics.rejected, "reason")["awaiting_start"]


def wait_for_slots(server: ProxyServer, slots: int) -> None:
    deadline = time.monotonic() + 30
    while server.pool.known_slots != slots and time.monotonic() < deadline:
        time.sleep(0.1)
    assert server.pool.known_slots == slots


async def first_answer(url: str, start: dict[str, Any] | None = None, **kwargs: Any) -> dict[str, Any]:
    """Connect, send a start at once, and return the first answer (the connection is closed)."""
    async with ws(url, **kwargs) as conn:
        await conn.send(json.dumps(start or {"type": "session.start", "prompt": PROMPT, "num_frames": 9}))
        return json.loads(await asyncio.wait_for(conn.recv(), 60))


def admitted(answer: dict[str, Any]) -> bool:
    """The proxy let the start through: the model's answer (its own server_busy included)."""
    return answer["type"] == "video.start" or (
        answer.get("code") == "server_busy" and "its share" not in answer.get("message", "")
    )


# --- the waiting share ---------------------------------------------------------------------------
def test_an_address_flooding_upgrades_does_not_refuse_another_address(proxies, triton) -> None:
    """127.0.0.1 opens an upgrade every 80 ms (12 a second) and never starts; 127.0.0.2 connects
    and starts meanwhile: every one of its attempts is upgraded and let through (before: 32 of 40
    got 503). The flooder never holds more than its part of the waiting share."""
    wait_idle(triton)
    server = proxies.server(
        max_connections=16,
        max_awaiting_start_per_client=2,
        max_sessions_per_client=8,
        max_open_connections=512,
        max_open_connections_per_client=256,
    )
    assert server.settings.awaiting_start_bound == 4
    before = awaiting_start_refusals(server)
    peak = {"held": 0}
    stop = threading.Event()

    def watch() -> None:  # the proxy's own count of the flooder's places, sampled from its loop's side
        while not stop.is_set():
            peak["held"] = max(peak["held"], server.context.waiting.held("127.0.0.1"))
            time.sleep(0.005)

    async def flood(until: asyncio.Event, held: list[Any], outcomes: list[str]) -> None:
        async def one() -> None:
            try:
                held.append(await ws(server.url))
                outcomes.append("upgraded")
            except InvalidStatus as exc:
                outcomes.append(str(exc.response.status_code))
            except (OSError, ConnectionClosed, asyncio.TimeoutError):
                outcomes.append("closed")

        tasks = []
        while not until.is_set():
            tasks.append(asyncio.ensure_future(one()))
            await asyncio.sleep(0.08)
        await asyncio.gather(*tasks)

    async def body() -> tuple[list[dict[str, Any]], list[str]]:
        until, held, outcomes = asyncio.Event(), [], []
        flooder = asyncio.ensure_future(flood(until, held, outcomes))
        answers = []
        try:
            await asyncio.sleep(1.0)  # the flood is under way
            for _ in range(8):
                answers.append(await first_answer(server.url, local_addr=("127.0.0.2", 0)))
                await asyncio.sleep(0.3)
        finally:
            until.set()
            await flooder
            for conn in held:
                await conn.close()
        return answers, outcomes

    sampler = threading.Thread(target=watch, daemon=True)
    sampler.start()
    try:
        answers, outcomes = run(body(), 180)
    finally:
        stop.set()
        sampler.join(5)
    assert all(admitted(a) for a in answers), answers
    assert sum(a["type"] == "video.start" for a in answers) >= 1, answers
    assert len(outcomes) >= 20, outcomes  # the flood did flood
    assert 1 <= peak["held"] <= 2, peak  # never more than its part
    assert awaiting_start_refusals(server) >= before  # any 503 went to the flooder alone
    wait_idle(triton)


def test_a_burst_of_clients_that_each_start_at_once_is_not_refused(proxies, triton) -> None:
    """40 clients of one address connect at once and each sends its start at once (the capacity
    benchmark's way in): none is refused at the upgrade (before: 11 x 503 awaiting_start); each
    start is answered by the model (video.start, or its own server_busy past its slots). The
    upgrades beyond the address's part wait for the earlier ones' starts: how long a held upgrade
    may wait is raised here, so that a loaded machine's slower reads are not what is tested."""
    wait_idle(triton)
    server = proxies.server(max_sessions_per_client=40, awaiting_place_seconds=120.0)
    assert server.settings.awaiting_start_per_client == 4  # a tenth of the burst
    before = awaiting_start_refusals(server)

    async def body() -> list[dict[str, Any] | str]:
        async def client(i: int) -> dict[str, Any] | str:
            start = {"type": "session.start", "prompt": f"{PROMPT} {i}", "num_frames": 9, "seed": i}
            try:
                async with connect(server.url, max_size=None, proxy=None, open_timeout=180, ping_interval=None) as conn:
                    await conn.send(json.dumps(start))
                    return json.loads(await asyncio.wait_for(conn.recv(), 120))
            except InvalidStatus as exc:
                return f"HTTP {exc.response.status_code}"

        return await asyncio.gather(*(client(i) for i in range(40)))

    answers = run(body(), 400)
    refused = [a for a in answers if isinstance(a, str) or not admitted(a)]
    assert not refused, refused
    assert awaiting_start_refusals(server) == before
    wait_idle(triton)


def test_an_upgrade_whose_client_leaves_while_it_is_held_leaves_the_queue(proxies, monkeypatch, caplog) -> None:
    """A client's third upgrade (its part is 2, both idle) is held; its client closes the TCP
    connection meanwhile: the held upgrade leaves the queue at once (not at the end of its wait),
    nothing is answered on the closed connection, and the client's next upgrade is held in turn."""
    # awaiting_place_seconds: only the close can end the wait
    server = proxies.server(max_awaiting_start_per_client=2, max_sessions_per_client=4, awaiting_place_seconds=3600.0)
    share = server.context.waiting
    monkeypatch.setattr(share, "grace", 3600.0)  # nobody is displaced

    def eventually(check: Any, what: str) -> None:
        deadline = time.monotonic() + 30
        while not check():
            assert time.monotonic() < deadline, what
            time.sleep(0.02)

    async def body() -> None:
        idle = [await ws(server.url, local_addr=("127.0.0.3", 0)) for _ in range(2)]
        try:
            host, port = server.url.split("/")[2].rsplit(":", 1)
            _, writer = await asyncio.open_connection(host, int(port), local_addr=("127.0.0.3", 0))
            writer.write(
                b"GET /v1/realtime/video HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
                b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                b"Sec-WebSocket-Version: 13\r\n\r\n"
            )
            await writer.drain()
            await asyncio.to_thread(eventually, lambda: share.queued("127.0.0.3") == 1, "the upgrade was not held")
            writer.close()
            await asyncio.to_thread(eventually, lambda: share.queued("127.0.0.3") == 0, "it stayed in the queue")
            assert share.held("127.0.0.3") == 2
        finally:
            for conn in idle:
                await conn.close()
        await asyncio.to_thread(eventually, lambda: share.held("127.0.0.3") == 0, "the idle ones did not leave")

    caplog.set_level(logging.WARNING)
    run(body(), 120)
    time.sleep(0.5)  # anything the closed request's handler would still do
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


# --- addresses grouped by network ----------------------------------------------------------------
def test_an_ipv6_client_holds_one_share_for_its_whole_slash_64(proxies, triton) -> None:
    """Behind a trusted proxy (X-Forwarded-For), the paced model's two slots: one IPv6 address
    holds one (half, by default); a second address of the same /64 is refused as the same
    client (before: every address of the /64 was a client of its own); another /64 gets the
    other slot."""
    wait_idle(triton, PACED_MODEL)
    server = proxies.server(model=PACED_MODEL, trusted_proxies=("127.0.0.1",))
    wait_for_slots(server, 2)

    def forwarded(address: str) -> dict[str, Any]:
        return {"additional_headers": {"X-Forwarded-For": address}}

    async def open_one(address: str) -> tuple[Any, dict[str, Any]]:
        for _ in range(100):  # a slot an earlier session left frees a moment after its end
            conn = await ws(server.url, **forwarded(address))
            await conn.send(json.dumps({"type": "session.start", "prompt": PROMPT, "num_frames": 9 * 100}))
            answer = json.loads(await asyncio.wait_for(conn.recv(), 30))
            if answer.get("code") != "server_busy" or "its share" in answer.get("message", ""):
                return conn, answer
            await conn.close()
            await asyncio.sleep(0.2)
        return conn, answer

    async def body() -> dict[str, dict[str, Any]]:
        seen = {}
        first, seen["first"] = await open_one("2001:db8:1:2::a")
        same, seen["same /64"] = await open_one("2001:db8:1:2:ffff::b")
        await same.close()
        other, seen["other /64"] = await open_one("2001:db8:1:3::a")
        await first.close()
        await other.close()
        return seen

    seen = run(body())
    assert seen["first"]["type"] == "video.start", seen
    assert seen["same /64"].get("code") == "server_busy" and "its share" in seen["same /64"]["message"], seen
    assert seen["other /64"]["type"] == "video.start", seen
    wait_idle(triton, PACED_MODEL)


# --- the share of slots across replicas ----------------------------------------------------------
def test_the_share_of_slots_counts_sessions_on_every_replica(proxies, triton, redis_url: str) -> None:
    """Two proxies sharing a real Redis, one Triton (the paced model: two slots, so one client's
    share is one): an address holding a session through one replica is refused at the other
    (before: 1 + 1, and 2 + 2 of 4), another address is not, and the share is free again once
    its session ends."""
    wait_idle(triton, PACED_MODEL)
    one = proxies.server(model=PACED_MODEL, session_store=redis_url, drain_seconds=30.0)
    two = proxies.server(model=PACED_MODEL, session_store=redis_url, drain_seconds=31.0)
    assert one is not two and one.context.holder != two.context.holder
    for server in (one, two):
        wait_for_slots(server, 2)

    async def hold(url: str, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        for _ in range(100):
            conn = await ws(url, **kwargs)
            await conn.send(json.dumps({"type": "session.start", "prompt": PROMPT, "num_frames": 9 * 100}))
            answer = json.loads(await asyncio.wait_for(conn.recv(), 30))
            if answer.get("code") != "server_busy" or "its share" in answer.get("message", ""):
                return conn, answer
            await conn.close()
            await asyncio.sleep(0.2)
        return conn, answer

    async def body() -> dict[str, dict[str, Any]]:
        seen = {}
        first, seen["at one"] = await hold(one.url)
        again, seen["again at two"] = await hold(two.url)
        await again.close()
        other, seen["another address at two"] = await hold(two.url, local_addr=("127.0.0.2", 0))
        await first.close()
        await other.close()
        for _ in range(100):  # the share frees once the first replica has seen its session end
            later, seen["after the end, at two"] = await hold(two.url)
            await later.close()
            if seen["after the end, at two"]["type"] == "video.start":
                break
            await asyncio.sleep(0.2)
        return seen

    seen = run(body(), 180)
    assert seen["at one"]["type"] == "video.start", seen
    busy = seen["again at two"]
    assert busy.get("code") == "server_busy" and "on every replica" in busy["message"], seen
    assert seen["another address at two"]["type"] == "video.start", seen
    assert seen["after the end, at two"]["type"] == "video.start", seen
    wait_idle(triton, PACED_MODEL)


# --- start fields bounded before anything is recorded or forwarded ---------------------------------
@pytest.mark.parametrize(
    "field,bound",
    [
        ({f"k{i}": 0 for i in range(215_000)}, "unknown_field has more than 256 keys and items"),
        (json.loads("[" * 20 + "]" * 20), "unknown_field is nested deeper than 8 levels"),
        ("x" * 3_000_000, "unknown_field is larger than 65536 bytes"),
    ],
    ids=["wide", "deep", "huge"],
)
def test_an_unknown_start_field_past_the_bounds_is_refused_unrecorded_and_unforwarded(
    proxies, triton, tmp_path: Path, field: Any, bound: str
) -> None:
    wait_idle(triton)
    root = tmp_path / "rec"
    server = proxies.server(recordings=str(root), record_all=True)
    registry = server.context.metrics.registry
    sessions_before = registry.get_sample_value("rtvideo_proxy_sessions_total") or 0.0
    start = {"type": "session.start", "prompt": PROMPT, "unknown_field": field}
    text = json.dumps(start)
    assert len(text) < 4 * 1024 * 1024  # within the start's own limit: the field's bounds refuse it

    async def body() -> list[dict[str, Any]]:
        async with ws(server.url) as conn:
            await conn.send(text)
            answers = [json.loads(await asyncio.wait_for(conn.recv(), 30)) for _ in range(2)]
            with contextlib.suppress(ConnectionClosed):
                await asyncio.wait_for(conn.recv(), 10)
        answers.append(await first_answer(server.url))  # the service goes on
        return answers

    error, done, after = run(body())
    assert error["type"] == "error" and error["code"] == "invalid_start" and bound in error["message"], error
    assert done["type"] == "session.done" and len(json.dumps(error)) < 1000
    assert after["type"] == "video.start", after
    # nothing forwarded: no session was made of it (the one after is the only one), and nothing recorded
    assert (registry.get_sample_value("rtvideo_proxy_sessions_total") or 0.0) == sessions_before + 1
    recorded = [p for p in root.rglob("events.jsonl")] if root.exists() else []
    assert all("unknown_field" not in p.read_text() for p in recorded)
    assert len(recorded) <= 1  # the session after's own
    wait_idle(triton)
