"""A model admits only what it can serve: as many sessions as its engine runs at once, and only
as much video as it delivers in real time (docs/triton-model.md "Real-time capacity").

The vLLM-Omni stand-in runs `max_num_seqs` requests at once and keeps the others waiting
without a word, as vLLM-Omni's scheduler does; the model's session limit follows it, so a
start beyond is `server_busy` at once, over gRPC and through the proxy, and a proxy with a
second Triton places it there. The built-in CAPPED model's capacity is set low, so the third
64x64 session at 16 fps does not fit and is refused before `video.start`.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from rtvideo.client.triton_stream import TritonStreamSession
from tests.support.omni_triton import CAPPED, CAPPED_FPS, ONE_REQUEST, derive_models
from tests.support.proxy_client import Ws, ws
from tests.support.proxy_host import run
from tests.support.triton_pair import Client, Host, healthz

#: a refused start's answer comes at once (a round trip), not after the 60 s stall timeout
AT_ONCE_SECONDS = 10.0  # a round trip, on a loaded 2-core machine too; well under the 60 s
#: these tests open several sessions from one address: the proxy's own per-client bound stays out of it
ROOM = {"max_sessions_per_client": 8}


def _models(port: int) -> dict[str, dict[str, Any]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=10) as response:
        return {entry["id"]: entry for entry in json.loads(response.read())["data"]}


def _model_once(port: int, name: str, ready: Any, timeout: float = 30.0) -> dict[str, Any]:
    """`/v1/models`' entry for `name` once `ready(entry)` (the figures come with the proxy's next
    health probe)."""
    deadline = time.monotonic() + timeout
    while not ready(entry := _models(port)[name]):
        assert time.monotonic() < deadline, entry
        time.sleep(0.2)
    return entry


def _until_started(session: TritonStreamSession) -> dict[str, Any]:
    for reply in session.until("video.start", 60):
        message = reply.message
    return message


def _stop(session: TritonStreamSession) -> None:
    session.stop()
    for _ in session.until("session.done", 60):
        pass


def test_a_start_beyond_the_engines_requests_is_server_busy_at_once_over_grpc(omni) -> None:
    proxies, engines = omni
    with TritonStreamSession(proxies.triton_url, ONE_REQUEST) as first:
        first.start("a harbour")
        _until_started(first)
        with TritonStreamSession(proxies.triton_url, ONE_REQUEST) as second:
            t0 = time.monotonic()
            second.start("a road")
            refused = second.next(10).message
            waited = time.monotonic() - t0
            assert refused["type"] == "error" and refused["code"] == "server_busy", refused
            assert "all 1 session slots are in use" in refused["message"]
            assert waited < AT_ONCE_SECONDS, waited
            assert second.next(10).message["type"] == "session.done"
        _stop(first)
    # the refused start never reached the engine, where it would have waited without a word
    assert len(engines[ONE_REQUEST].calls("generate")) == len(engines[ONE_REQUEST].calls("scheduled"))


def test_a_start_beyond_the_engines_requests_is_server_busy_at_once_through_the_proxy(omni) -> None:
    proxies, _ = omni

    async def body() -> float:
        async with ws(proxies.url(model=ONE_REQUEST, **ROOM)) as conn:
            first = Ws(conn)
            await first.start("a harbour")
            async with ws(proxies.url(model=ONE_REQUEST, **ROOM)) as other:
                second = Ws(other)
                t0 = time.monotonic()
                await second.send({"type": "session.start", "prompt": "a road"})
                refused = await second.next(10)
                waited = time.monotonic() - t0
                assert refused["type"] == "error" and refused["code"] == "server_busy", refused
                assert (await second.next(10))["type"] == "session.done"
            await first.send({"type": "session.stop"})
            await first.finish()
            return waited

    assert run(body()) < AT_ONCE_SECONDS


@pytest.fixture
def second_triton(tmp_path) -> Iterator[str]:
    """A second tritonserver with the one-request stand-in model."""
    from rtvideo.triton.command import TritonConfig
    from rtvideo.triton.server import TritonServer, free_port

    repo = tmp_path / "repo"
    derive_models(repo, [ONE_REQUEST])
    server = TritonServer(
        TritonConfig(model_repository=repo, grpc_port=free_port(), http_port=free_port(), metrics_port=free_port()),
        stdout=tmp_path / "triton.log",
    )
    server.start(timeout=300)
    try:
        yield server.grpc_url
    finally:
        server.stop()


def test_with_two_tritons_the_second_session_runs_on_the_other(omni, second_triton) -> None:
    proxies, _ = omni
    host = Host()
    try:
        server = host.proxy(f"{proxies.triton_url},{second_triton}", model=ONE_REQUEST, **ROOM)
        deadline = time.monotonic() + 60
        # each endpoint's session limit is its engine's, from its probe's pong (max_sessions auto)
        while [e["capacity"] for e in healthz(server)["endpoints"]] != [1, 1]:
            assert time.monotonic() < deadline, healthz(server)
            time.sleep(0.1)

        async def body() -> dict[str, str]:
            first = await Client.open(server.url)
            second = await Client.open(server.url)
            assert first.request_id and second.request_id, (first.t.messages, second.t.messages)
            placed = host.placements(server)
            for client in (first, second):
                await client.conn.send(json.dumps({"type": "session.stop"}))
                await client.until("session.done", 60)
                await client.conn.close()
            return placed

        placed = run(body())
        assert sorted(placed.values()) == sorted([proxies.triton_url, second_triton]), placed
    finally:
        host.close()


def test_a_start_beyond_the_real_time_capacity_is_refused_before_video_start(omni) -> None:
    """CAPPED delivers CAPPED_FPS (40) frames per second at 64x64: two sessions at 16 fps take 32,
    a third would take 48. `/v1/models` shows the figure."""
    proxies, _ = omni
    model = _model_once(proxies.server(model=CAPPED).port, CAPPED, lambda e: e["realtime_capacity_fps"] is not None)
    assert model["realtime_capacity_fps"] == CAPPED_FPS
    assert [(e["realtime_capacity_fps"], e["realtime_capacity_from"]) for e in model["endpoints"]] == [
        (CAPPED_FPS, "setting")
    ]

    async def body() -> None:
        url = proxies.url(model=CAPPED, **ROOM)
        async with ws(url) as a, ws(url) as b, ws(url) as c:
            first, second, third = Ws(a), Ws(b), Ws(c)
            await first.start("a harbour", width=64, height=64, fps=16)
            await second.start("a field", width=64, height=64, fps=16)
            await third.send({"type": "session.start", "prompt": "a road", "width": 64, "height": 64, "fps": 16})
            refused = await third.next(10)
            assert refused["type"] == "error" and refused["code"] == "server_busy", refused
            assert f"about {CAPPED_FPS} frames per second" in refused["message"] and "take 32" in refused["message"]
            assert [m["type"] for m in third.t.messages] == ["error"]  # no video.start before it
            # a smaller ask fits beside them: 64x32 at 8 fps takes 4 of the 8 left
            async with ws(url) as d:
                fourth = Ws(d)
                await fourth.start("a lake", width=64, height=32, fps=8)
                await fourth.send({"type": "session.stop"})
                await fourth.finish()
            for s in (first, second):
                await s.send({"type": "session.stop"})
                await s.finish()

    run(body())


def test_models_show_an_engines_running_capacity(omni) -> None:
    """A vLLM-Omni model measures its engine as it runs: a number once a session has run (the
    built-in generator's warm-up at load: tests/unit/backend/test_realtime_capacity.py)."""
    proxies, _ = omni

    async def one_session() -> None:
        async with ws(proxies.url(model=ONE_REQUEST, **ROOM)) as conn:
            s = Ws(conn)
            await s.start("a harbour", num_frames=16)  # four chunks of 4: three timed
            await s.finish()

    run(one_session())
    model = _model_once(
        proxies.server(model=ONE_REQUEST).port, ONE_REQUEST, lambda e: e["realtime_capacity_fps"] is not None
    )
    (engine,) = model["endpoints"]
    assert engine["realtime_capacity_from"] == "running" and engine["realtime_capacity_fps"] > 0, engine
    assert engine["max_sessions"] == 1 and model["realtime_capacity_fps"] == engine["realtime_capacity_fps"]
    assert "one request at a time" in engine["max_sessions_reason"], engine  # and why: the engine's max_num_seqs
