"""What one client leaves in the shared session store (issue 46, item 2), through a real proxy in front
of the session's real Triton, with a real redis-server of the test's own: padded interactions are
kept as parsed, a `rate_limited` flood adds nothing, a session that ends leaves no key; a store at
its `maxmemory` is said to refuse writes (`/healthz`, `/readyz`, the alert's expression) while new
sessions stream on."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from tests.deploy.test_observability_assets import rules
from tests.support.http_calls import fetch
from tests.support.promql import Evaluator, scrape_series
from tests.support.proxy_host import ProxyHost, run, wait_idle
from tests.support.redis_server import serve_redis
from tests.support.replica_servers import replica_servers
from tests.support.resume_client import Leg

PROMPT = "a lighthouse on a cliff at dusk"
FRAMES = 4000  # more than the test reads: it stops the session
SIZE = {"width": 128, "height": 96}
PAD = "x" * 100_000
FLOOD = 300


async def session_bytes(client: aioredis.Redis) -> tuple[int, list[str]]:
    """MEMORY USAGE of every session key (`rtvideo:` but the proxies' own), and the log's entries."""
    total, log = 0, []
    async for key in client.scan_iter(match="rtvideo:*"):
        name = key.decode()
        if name.split(":")[1] in ("s", "f", "p", "k"):
            total += int(await client.memory_usage(key, samples=0) or 0)
        if name.startswith("rtvideo:f:"):
            log += [entry.decode() for entry in await client.lrange(key, 0, -1)]
    return total, log


async def session_keys(client: aioredis.Redis) -> list[str]:
    """A session's keys (record, log, payloads, lease, handoff, token bindings), not the proxies' own."""
    keys = [key.decode() async for key in client.scan_iter(match="rtvideo:*")]
    return sorted(key for key in keys if key.split(":")[1] in ("s", "f", "p", "l", "h", "k"))


def test_a_flooding_client_leaves_its_parsed_session_and_nothing_once_it_ends(
    proxies: ProxyHost, triton: Any, tmp_path: Path
) -> None:
    """300 interactions, each with a 100 kB pad beside `interaction` (30 MB), sent back to back:
    those acked are stored as parsed, those refused (`rate_limited`) leave nothing, and the whole
    session takes a small fraction of one pad per interaction; after its stop, no key is left."""
    wait_idle(triton)
    with serve_redis(tmp_path) as redis, replica_servers(proxies, count=1, session_store=redis.url) as (server,):

        async def body() -> tuple[int, list[str], int, int, list[str]]:
            client = aioredis.from_url(redis.url)
            try:
                leg = await Leg.open(server.url)
                await leg.start(PROMPT, num_frames=FRAMES, seed=9, **SIZE)
                await leg.media(1)
                for i in range(FLOOD):
                    interaction = {"event_id": f"p{i}", "event": {"prompt": f"a storm, change {i}"}}
                    await leg.send({"type": "session.interaction", "interaction": interaction, "pad": PAD})
                acked: set[str] = set()
                limited = 0
                while len(acked) + limited < FLOOD:
                    message = await leg.read(60)
                    if message["type"] == "session.interaction.queued":
                        acked.add(message["event_id"])
                    elif message["type"] == "error":  # the message rate, or 64 waiting for a chunk
                        assert message["code"] in ("rate_limited", "interaction_queue_full"), message
                        limited += 1
                used, log = await session_bytes(client)
                await leg.send({"type": "session.stop"})
                await leg.until("session.done", 60)
                await leg.conn.close()
                deadline = time.monotonic() + 30
                while (left := await session_keys(client)) and time.monotonic() < deadline:
                    await asyncio.sleep(0.1)
                return used, log, len(acked), limited, left
            finally:
                await client.aclose()

        used, log, acked, limited, left = run(body(), timeout=240)
    assert acked >= 1 and limited >= 1 and acked + limited == FLOOD  # the flood was refused, in part
    events = [json.loads(entry[1:]) for entry in log if entry.startswith("e")]
    assert len(events) == acked and all(set(e) == {"type", "interaction"} for e in events)  # as parsed
    assert not [entry for entry in log if "rate_limited" in entry or "interaction_queue_full" in entry]
    assert max(len(entry) for entry in log) < 4_000  # no entry holds a pad
    assert used < acked * 2_000 + 12_000_000, used  # the log, and the payloads (replay buffer) beside it
    assert left == []


def test_a_store_at_its_maxmemory_is_said_to_refuse_writes_and_sessions_stream_on(
    proxies: ProxyHost, triton: Any, tmp_path: Path
) -> None:
    """Redis answers PING at its `maxmemory` (noeviction) but refuses every write: `/healthz` says
    `refusing_writes` (it said `shared` before), `/readyz` says so too and stays ready, the alert's
    expression returns the proxy, and a new session starts and streams; with room again, `shared`."""
    expression = rules()["RtvideoSessionStoreRefusingWrites"]["expr"]
    wait_idle(triton)
    with serve_redis(tmp_path) as redis, replica_servers(proxies, count=1, session_store=redis.url) as (server,):
        base = f"http://127.0.0.1:{server.port}"

        def health() -> str:
            _, body, _ = fetch(base + "/healthz")  # its status is the backend's (starting at first)
            return str(json.loads(body)["session_store"])

        def ready() -> tuple[int, str]:
            status, body, _ = fetch(base + "/readyz")
            return status, str(json.loads(body)["session_store"])

        def scrape() -> dict[str, Any]:
            text = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
            return scrape_series(text)

        async def body() -> tuple[str, str, tuple[int, str], dict[Any, float], str]:
            client = aioredis.from_url(redis.url)
            try:
                deadline = time.monotonic() + 60  # the proxy's first probe of its Triton
                while (await asyncio.to_thread(ready))[0] != 200:
                    assert time.monotonic() < deadline, "never ready"
                    await asyncio.sleep(0.2)
                before = await asyncio.to_thread(health)
                quiet = await asyncio.to_thread(scrape)
                await client.config_set("maxmemory-policy", "noeviction")
                await client.config_set("maxmemory", 1)
                try:
                    full = await asyncio.to_thread(health)
                    deadline = time.monotonic() + 30  # the proxy looks every 5 s
                    while (said := await asyncio.to_thread(ready))[1] != "refusing_writes":
                        assert time.monotonic() < deadline, said
                        await asyncio.sleep(0.2)
                    fired = Evaluator(quiet, await asyncio.to_thread(scrape), 60.0)(expression)
                    leg = await Leg.open(server.url)
                    start = await leg.start(PROMPT, num_frames=FRAMES, seed=4, **SIZE)
                    assert start["type"] == "video.start", start
                    await leg.media(2)
                    await leg.send({"type": "session.stop"})
                    await leg.until("session.done", 60)
                    await leg.conn.close()
                finally:
                    await client.config_set("maxmemory", 0)
                return before, full, said, fired, await asyncio.to_thread(health)
            finally:
                await client.aclose()

        before, full, said, fired, after = run(body(), timeout=240)
    assert (before, full, after) == ("shared", "refusing_writes", "shared")
    assert said == (200, "refusing_writes")  # said, and still ready
    assert list(fired.values()) and all(v > 0 for v in fired.values()), fired
