"""Sessions that outlive their proxy (docs/operations.md "Rolling updates", "When a proxy dies"):
two real proxies sharing a real Redis (`--session-store`), the session's real Triton, real
WebSocket clients and real PyAV decoding. A proxy that shuts down hands each session off
(close 1012); its client resumes through the other proxy, which takes the session over from
the store: the same request id, indices that go on, one decodable stream whose frames are the
undisturbed session's, its events' outcomes kept."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from rtvideo.backend.builtin.generator import BuiltinGenerator
from rtvideo.proxy.app import ProxyServer
from tests.support.http_calls import fetch, metric_values
from tests.support.proxy_host import ProxyHost, run, wait_idle
from tests.support.replica_servers import replica_servers, through_a_handoff
from tests.support.resume_client import Leg, continuous_stream, media_pairs
from tests.support.streams import PACED_MODEL, decode, wait_for_metric
from tests.support.undisturbed import regenerate, worst_psnr

PROMPT = "a lighthouse on a cliff at dusk"
FRAMES = 4000  # more than the test reads: it stops the session
SIZE = {"width": 128, "height": 96}
STORM = {"type": "session.interaction", "interaction": {"event_id": "e1", "event": {"prompt": "a storm"}}}


@pytest.fixture
def replicas(proxies: ProxyHost, redis_url: str) -> Iterator[list[ProxyServer]]:
    """Two proxies of one deployment: one Triton, one shared store."""
    with replica_servers(proxies, session_store=redis_url, drain_seconds=5.0) as started:
        yield started


@pytest.fixture
def paced_replicas(proxies: ProxyHost, redis_url: str) -> Iterator[list[ProxyServer]]:
    """As `replicas`, on the model that paces its stream: a session lasts as long as its video."""
    with replica_servers(proxies, model=PACED_MODEL, session_store=redis_url, drain_seconds=5.0) as started:
        yield started


def undisturbed(sent: list[dict[str, Any]], legs: list[Leg], generator: BuiltinGenerator) -> np.ndarray:
    """The same session re-generated in this process from what its client sent and received
    (its events where they took effect), encoded by one encoder: as if nothing had happened."""
    lines = [{"dir": "in", "message": m} for m in sent]
    lines += [{"dir": "out", "message": m} for leg in legs for m in leg.messages]
    return regenerate(lines, generator, SIZE["width"], SIZE["height"])


def test_a_proxy_shutdown_hands_its_session_to_the_other_replica(
    proxies: ProxyHost, triton: Any, replicas: list[ProxyServer], generator: BuiltinGenerator
) -> None:
    wait_idle(triton)
    a, b = replicas
    seed = 77

    async def body() -> tuple[Leg, Leg, dict[str, Any]]:
        first = await Leg.open(a.url)
        start = await first.start(PROMPT, num_frames=FRAMES, seed=seed, **SIZE)
        assert start["type"] == "video.start" and start["resume_token"]  # resumable by default with a store
        second, resumed = await through_a_handoff(proxies, first, start["resume_token"], a, b, STORM)
        return first, second, resumed

    first, second, resumed = run(body(), timeout=240)
    assert resumed["request_id"] == first.messages[0]["request_id"]
    pairs = media_pairs([first, second])
    assert [m["transport_chunk_index"] for m, _ in pairs] == list(range(len(pairs)))  # no repeat, no gap
    assert not [m for m in second.messages if m["type"] == "error"], second.messages
    done = second.messages[-1]
    assert done["type"] == "session.done" and done["chunks"] == len(pairs)
    assert "e1" not in done["unapplied_event_ids"] and "e1" not in done["unfinished_event_ids"]
    got = decode(continuous_stream([first, second]))
    assert len(got) == sum(m["num_frames"] for m, _ in pairs)
    sent = [{"type": "session.start", "prompt": PROMPT, "num_frames": FRAMES, "seed": 77, **SIZE}, STORM]
    want = undisturbed(sent, [first, second], generator)
    assert got.shape == want.shape
    worst = worst_psnr(got, want)
    assert worst >= 33.0, worst  # the encoder's noise after the move (tests/e2e/test_moves.py)
    assert "e1" in {e for m, _ in pairs for e in m["started_event_ids"]}


def test_two_resumes_racing_at_two_replicas_leave_one_driver(
    proxies: ProxyHost, triton: Any, paced_replicas: list[ProxyServer]
) -> None:
    """The owner's link drops and its token is used at both replicas at once: one resume wins,
    the other is refused, and the session has one driver (one Triton sequence, one proxy)."""
    wait_idle(triton, PACED_MODEL)
    replicas = paced_replicas
    a, b = replicas

    async def body() -> tuple[list[dict[str, Any]], int]:
        first = await Leg.open(a.url)
        start = await first.start(PROMPT, num_frames=FRAMES, seed=5, **SIZE)
        await first.media(2)
        first.drop()
        at_a = Leg.resumed(a.url, start["resume_token"], first.last_index)

        async def at_b() -> tuple[Leg, dict[str, Any]]:
            leg = await Leg.open(b.url)
            return leg, await leg.resume(start["resume_token"], first.last_index)

        (leg_a, answer_a), (leg_b, answer_b) = await asyncio.gather(at_a, at_b())
        answers = [answer_a, answer_b]
        winner = leg_a if answer_a["type"] == "video.start" else leg_b
        await winner.media(2)
        live = await asyncio.to_thread(proxies.call, _count_live(replicas))
        # one Triton sequence (the paced model holds it while it streams)
        await asyncio.to_thread(wait_for_metric, triton, "rtvideo_active_sessions", PACED_MODEL, 1, 30)
        await winner.send({"type": "session.stop"})
        await winner.until("session.done", timeout=60)
        return answers, live

    answers, live = run(body(), timeout=180)
    kinds = sorted(a["type"] for a in answers)
    assert kinds == ["error", "video.start"], answers
    assert next(a for a in answers if a["type"] == "error")["code"] == "invalid_resume"
    assert live == 1  # one proxy drives it


async def _count_live(servers: list[ProxyServer]) -> int:
    return sum(len(server.context.sessions) for server in servers)


def test_with_the_store_unreachable_sessions_are_served_without_continuation(proxies: ProxyHost, triton: Any) -> None:
    """Nothing listens where the store should be: a session starts and streams, an interaction is
    answered `store_unavailable` at once (never acked unkept; docs/decisions.md "The session store
    under faults"), health says the store is unreachable (the proxy stays ready), the errors are
    counted."""
    wait_idle(triton)

    unreachable = "redis://127.0.0.1:1/0"  # port 1: connection refused
    with replica_servers(proxies, count=1, session_store=unreachable) as (server,):

        async def body() -> Leg:
            leg = await Leg.open(server.url)
            await leg.start(PROMPT, num_frames=FRAMES, seed=9, **SIZE)
            await leg.media(2)
            await leg.send(STORM)
            await leg.until("error", event_id="e1")
            await leg.media(2)
            await leg.send({"type": "session.stop"})
            await leg.until("session.done", timeout=60)
            return leg

        leg = run(body(), timeout=120)
        errors = [m for m in leg.messages if m["type"] == "error"]
        assert [(m["code"], m["event_id"]) for m in errors] == [("store_unavailable", "e1")], leg.messages
        assert not [m for m in leg.messages if m["type"] == "session.interaction.queued"]
        status, body, _ = fetch(f"http://127.0.0.1:{server.port}/healthz")
        health = json.loads(body)
        assert status == 200 and health["session_store"] == "unreachable", health
        assert fetch(f"http://127.0.0.1:{server.port}/readyz")[0] == 200
        values = metric_values(server.port)
        assert values['rtvideo_proxy_store_errors_total{call="acquire"}'] >= 1
        assert values["rtvideo_proxy_store_refusals_total"] == 1


def test_a_resume_at_another_replica_takes_a_live_holders_session(
    proxies: ProxyHost, triton: Any, paced_replicas: list[ProxyServer]
) -> None:
    """The owner's link drops and its resume reaches the other replica while the holder lives:
    the holder is asked to let go and does (`handoff`); the session goes on there, once."""
    wait_idle(triton, PACED_MODEL)
    a, b = paced_replicas

    async def body() -> tuple[Leg, Leg, dict[str, Any], int]:
        first = await Leg.open(a.url)
        start = await first.start(PROMPT, num_frames=FRAMES, seed=6, **SIZE)
        await first.media(2)
        first.drop()
        second, resumed = await Leg.resumed(b.url, start["resume_token"], first.last_index)
        await second.media(2)
        live = await asyncio.to_thread(proxies.call, _count_live([a]))
        await asyncio.to_thread(wait_for_metric, triton, "rtvideo_active_sessions", PACED_MODEL, 1, 30)
        await second.send({"type": "session.stop"})
        await second.until("session.done", timeout=60)
        return first, second, resumed, live

    first, second, resumed, live_at_a = run(body(), timeout=180)
    assert resumed["type"] == "video.start" and resumed["resumed"] is True, resumed
    assert resumed["request_id"] == first.messages[0]["request_id"]
    assert live_at_a == 0  # the old holder let go
    pairs = media_pairs([first, second])
    assert [m["transport_chunk_index"] for m, _ in pairs] == list(range(len(pairs)))
    assert decode(continuous_stream([first, second])).shape[0] == sum(m["num_frames"] for m, _ in pairs)
    assert metric_values(b.port)['rtvideo_proxy_sessions_taken_over_total{reason="handoff"}'] == 1
