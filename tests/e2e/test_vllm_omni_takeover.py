"""A vllm_omni session whose proxy shuts down goes on through another replica (docs/operations.md
"Rolling updates"): the engine's state cannot be rebuilt, so the replica that takes it over
starts it again from the last frame the store kept (rtvideo.core.approximation), its indices and
its stream continuing. Real tritonserver with the stand-in engine (the `omni` fixture), two real
proxies sharing a real Redis, real WebSocket clients; what reached the engine is read from its
record."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from rtvideo.proxy.app import ProxyServer
from tests.support.omni_triton import FPC, MODEL, Engine
from tests.support.proxy_host import ProxyHost, run
from tests.support.replica_servers import hand_over, replica_servers
from tests.support.resume_client import Leg, continuous_stream, media_pairs
from tests.support.streams import decode

CHUNKS = 14


@pytest.fixture
def omni_replicas(omni: tuple[ProxyHost, dict[str, Engine]], redis_url: str) -> Iterator[list[ProxyServer]]:
    proxies, _ = omni
    with replica_servers(proxies, model=MODEL, session_store=redis_url) as started:
        yield started


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
        await first.media(2, 60)
        await first.interact("late snow", "late", 1)
        await first.until("session.interaction.queued", event_id="late")
        await first.media(2, 60)
        second, resumed = await hand_over(proxies, first, start["resume_token"], a, b)
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
