"""A vllm_omni session whose proxy shuts down goes on through another replica (docs/operations.md
"Rolling updates"): the engine's state cannot be rebuilt, so the replica that takes it over
starts it again from the last frame the store kept (rtvideo.core.approximation), its indices and
its stream continuing. Real tritonserver with the stand-in engine (the `omni` fixture), two real
proxies sharing a real Redis, real WebSocket clients; what reached the engine is read from its
record."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from rtvideo.proxy.app import ProxyServer
from rtvideo.proxy.settings import ProxySettings
from rtvideo.triton.access import key_from_env
from tests.support.omni_triton import FPC, MODEL, Engine
from tests.support.proxy_host import ProxyHost, run
from tests.support.resume_client import Leg, continuous_stream, media_pairs
from tests.support.streams import decode

CHUNKS = 14


@pytest.fixture
def omni_replicas(omni: tuple[ProxyHost, dict[str, Engine]], redis_url: str) -> Iterator[list[ProxyServer]]:
    proxies, _ = omni
    started: list[ProxyServer] = []

    async def start() -> ProxyServer:
        settings = ProxySettings(
            port=0, triton_url=proxies.triton_url, model=MODEL, triton_key=key_from_env(), session_store=redis_url
        )
        server = ProxyServer(settings)
        await server.start()
        return server

    try:
        started.extend(proxies.call(start()) for _ in range(2))
        yield started
    finally:
        for server in started:
            proxies.call(server.stop(), timeout=90)


async def _media(leg: Leg, count: int) -> None:
    for _ in range(count):
        while (await leg.read(60))["type"] != "video.chunk_metadata" or leg.messages[-1]["kind"] != "media":
            pass


def test_a_handed_off_vllm_omni_session_goes_on_from_its_last_frame(
    omni: tuple[ProxyHost, dict[str, Engine]], omni_replicas: list[ProxyServer]
) -> None:
    proxies, engines = omni
    engine = engines[MODEL]
    a, b = omni_replicas

    async def body() -> tuple[Leg, Leg, dict[str, Any]]:
        first = await Leg.open(a.url)
        start = await first.start("a harbour", seed=611, num_frames=CHUNKS * FPC)
        assert start["type"] == "video.start" and start["resume_token"], start
        await _media(first, 2)
        await first.interact("late snow", "late", 1)
        await first.until("session.interaction.queued", event_id="late")
        await _media(first, 2)
        handed = asyncio.wrap_future(asyncio.run_coroutine_threadsafe(a.drain(0.0), proxies.loop))
        while True:
            try:
                await first.read(10)
            except Exception:  # noqa: BLE001 - the close ends the read
                break
        assert first.conn.close_code == 1012
        await handed
        second, resumed = await Leg.resumed(b.url, start["resume_token"], first.last_index)
        assert resumed["type"] == "video.start" and resumed["resumed"] is True, resumed
        await second.until("session.done", timeout=120)
        await second.conn.close()
        return first, second, resumed

    first, second, resumed = run(body(), timeout=300)
    assert resumed["request_id"] == first.messages[0]["request_id"]
    pairs = media_pairs([first, second])
    assert [m["transport_chunk_index"] for m, _ in pairs if m["kind"] == "media"] == list(range(CHUNKS))
    assert [m["generation_chunk_index"] for m, _ in pairs if m["kind"] == "media"] == list(range(CHUNKS))
    assert not [m for leg in (first, second) for m in leg.messages if m["type"] == "error"]
    video = decode(continuous_stream([first, second]))
    assert video.shape[0] == CHUNKS * FPC  # one stream, every frame
    calls = engine.calls("generate", seed=611)
    assert len(calls) == 2 and calls[0]["extra_args_image"] is None, calls
    taken = calls[1]  # the takeover: the prompt in effect, from the last frame handed out
    assert taken["prompt"]["prompt"] == "late snow"
    before = calls[0]["num_frames"] - taken["num_frames"]
    assert before % FPC == 0 and 0 < before < CHUNKS * FPC, calls
    seen = video[before - 1].reshape(-1, 3).mean(axis=0) / 255
    summary = taken["extra_args_image"]
    assert summary is not None, taken
    engine_first = (np.array(summary["mean"]) + 1) / 2
    assert np.abs(engine_first - seen).max() < 0.03, (engine_first, seen)
