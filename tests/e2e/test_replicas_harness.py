"""The replicas harness (tests/support/replicas.py) and what it is for: two real proxy processes
sharing a real Redis behind a load balancer, the session's real Triton, the real Python client.
One resumable session through the balancer outlives a kill -9 of the replica that drives it,
then a SIGTERM of the other once the first is back: the client resumes on its own each time
(a dropped connection, then close 1012), through the balancer, at the replica left; the stream
goes on under the same request id with no index repeated or missing, and no error."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from rtvideo.client.session import Chunk, RealtimeVideoClient
from tests.support.proxy_host import run, wait_idle
from tests.support.replicas import Replicas
from tests.support.streams import PACED_MODEL, decode

PROMPT = "a lighthouse on a cliff at dusk"
FRAMES = 4000  # more than the test reads: it stops the session


@pytest.fixture
def deployment(triton: Any, redis_url: str, tmp_path: Path) -> Iterator[Replicas]:
    """Two proxies of one deployment (the shipped pacing: a gentle load), one shared store."""
    wait_idle(triton, PACED_MODEL)
    with Replicas(
        tmp_path, triton.grpc_url, redis_url, model=PACED_MODEL, triton_metrics_port=triton.config.metrics_port
    ) as replicas:
        yield replicas


async def _media(chunks: AsyncIterator[Chunk], got: list[Chunk], count: int) -> None:
    """Read on until `count` more media chunks came (the trailer would end the iteration early)."""
    want = sum(c.metadata["kind"] == "media" for c in got) + count
    while sum(c.metadata["kind"] == "media" for c in got) < want:
        got.append(await anext(chunks))


async def _resumed(client: RealtimeVideoClient, chunks: AsyncIterator[Chunk], got: list[Chunk], resumes: int) -> None:
    """Read on until the client resumed `resumes` times in all (chunks the old connection still
    delivered come first), then two media chunks of the new connection."""
    while client.resumes < resumes:
        got.append(await anext(chunks))
    await _media(chunks, got, 2)


def test_a_session_outlives_a_kill_9_and_a_sigterm_through_the_balancer(deployment: Replicas) -> None:
    replicas = deployment
    taken: list[tuple[int, float]] = []  # (replica, sessions it took over)

    def takeovers(index: int) -> tuple[int, float]:
        return index, replicas[index].metric("rtvideo_proxy_sessions_taken_over_total")

    async def body() -> tuple[dict[str, Any], list[Chunk], RealtimeVideoClient, Any]:
        got: list[Chunk] = []
        async with RealtimeVideoClient(replicas.url) as client:
            start = await client.start(PROMPT, num_frames=FRAMES, seed=5)
            assert start["resume_token"], start  # resumable by default: the store is shared
            chunks = client.chunks()
            await _media(chunks, got, 2)
            (holder,) = await asyncio.to_thread(replicas.holding)
            other = 1 - holder

            await asyncio.to_thread(replicas.kill9, holder)
            await _resumed(client, chunks, got, 1)  # at `other`, which took the session over
            assert await asyncio.to_thread(replicas.holding) == [other]
            taken.append(await asyncio.to_thread(takeovers, other))

            await asyncio.to_thread(replicas.restart, holder)
            ended = await asyncio.to_thread(replicas.sigterm, other)
            await _resumed(client, chunks, got, 2)  # handed off with 1012, at `holder`'s new process
            assert await asyncio.to_thread(replicas.holding) == [holder]
            taken.append(await asyncio.to_thread(takeovers, holder))

            await client.stop()
            got.extend([c async for c in chunks])
            return start, got, client, ended

    start, got, client, ended = run(body(), timeout=240)
    assert ended.code == 0, replicas[1 - taken[1][0]].tail()  # the SIGTERM's drain ended cleanly
    assert [count for _, count in taken] == [1, 1]  # each replica took the session over once
    assert client.errors.empty() and client.failure is None
    assert client.done is not None and client.done["request_id"] == start["request_id"]
    assert {c.metadata["request_id"] for c in got} == {start["request_id"]}  # one session throughout
    indices = [c.metadata["transport_chunk_index"] for c in got]
    assert indices == list(range(indices[0], indices[0] + len(indices))), indices  # none again, none lost
    media = [c for c in got if c.metadata["kind"] == "media"]
    frames = decode(b"".join(c.data for c in got))
    assert len(frames) == sum(c.metadata["num_frames"] for c in media)


def test_an_interaction_is_acked_after_a_takeover(deployment: Replicas) -> None:
    replicas = deployment

    async def body() -> dict[str, Any] | None:
        got: list[Chunk] = []
        async with RealtimeVideoClient(replicas.url) as client:
            await client.start(PROMPT, num_frames=FRAMES, seed=6)
            chunks = client.chunks()
            await _media(chunks, got, 1)
            await client.interact("a storm at sea", event_id="before")
            (holder,) = await asyncio.to_thread(replicas.holding)
            await asyncio.to_thread(replicas.sigterm, holder)
            await _resumed(client, chunks, got, 1)  # handed off with 1012, at the other replica
            try:
                return await client.interact("a calm sea", event_id="after", timeout=5, attempts=2)
            except asyncio.TimeoutError:
                return None  # sent twice, no ack

    ack = run(body(), timeout=120)
    assert ack is not None and ack["event_id"] == "after"
