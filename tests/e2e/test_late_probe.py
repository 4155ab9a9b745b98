"""A late probe is not a full model (issue 46 item 6; docs/operations.md "Busy, late and down"),
with a real Triton, the real model and a real proxy.

On a loaded host a health probe answered after its deadline was taken for "every sequence slot
is held" (the heartbeat moved) and new connections got 503 "Video backend busy" with most slots
free. Here every probe is late on purpose (a deadline far shorter than any answer): the model
reports its batcher's slots on Triton's /metrics, the proxy calls it late, not busy and not
down, and a new WebSocket session is served while slots are free. The model's slot gauges are
checked against what it holds (a live session holds one; an ended one none)."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

from rtvideo.proxy.placement.heartbeat import HELD_METRIC, SLOTS_METRIC, slots_full_in
from rtvideo.triton.access import key_from_env
from rtvideo.triton.server import TritonServer
from tests.support.http_calls import metric_values
from tests.support.proxy_client import Ws, ws
from tests.support.proxy_host import ProxyHost
from tests.support.streams import SLOTS_MODEL as MODEL
from tests.support.streams import SLOTS_MODEL_SLOTS

#: the session's Triton serves this model (tests/conftest.py) to these tests alone
SLOTS = SLOTS_MODEL_SLOTS


@pytest.fixture
def served(triton: TritonServer) -> tuple[TritonServer, str]:
    """The session's Triton and its key (where `rtvideo serve` and the proxies read it)."""
    key = key_from_env()
    assert key, "the session's Triton is keyed"
    return triton, key


def _metrics_text(server: TritonServer) -> str:
    return urllib.request.urlopen(server.metrics_url, timeout=5).read().decode()


def _slots(server: TritonServer) -> tuple[float, float]:
    values = {}
    for line in _metrics_text(server).splitlines():
        for name in (SLOTS_METRIC, HELD_METRIC):
            if line.startswith(name + "{") and f'model="{MODEL}"' in line:
                values[name] = float(line.rsplit(" ", 1)[1])
    return values.get(SLOTS_METRIC, -1.0), values.get(HELD_METRIC, -1.0)


def _wait_slots(server: TritonServer, held: float, timeout: float = 30.0) -> str:
    """Poll until the model reports SLOTS slots, `held` of them held (the flush is once a second;
    the deadline only bounds a failure). Returns the metrics text then."""
    deadline = time.monotonic() + timeout
    while (seen := _slots(server)) != (SLOTS, held):
        assert time.monotonic() < deadline, seen
        time.sleep(0.2)
    return _metrics_text(server)


def _health(port: int) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_the_model_reports_its_sequence_slots(served: tuple[TritonServer, str]) -> None:
    """The gauges the proxy decides on, from the real model: none held when idle, one per live
    session, none again once it ended (its sequence_end frees the slot)."""
    server, key = served
    host = ProxyHost(server.grpc_url)
    try:
        proxy = host.server(model=MODEL, triton_key=key, triton_metrics_port=0)
        idle = _wait_slots(server, 0)
        assert slots_full_in(idle, MODEL) is False, idle

        async def body() -> str:
            async with ws(proxy.url) as conn:
                s = Ws(conn)
                await s.start("a lighthouse in fog", seed=1)  # its video.start came
                held = await asyncio.to_thread(_wait_slots, server, 1)
                print(f"--- Triton's /metrics with one live session ---\n{held}")
                await s.send({"type": "session.stop"})
                while (await s.next(60))["type"] != "session.done":
                    pass
                return held

        held = asyncio.run(asyncio.wait_for(body(), 120))
        assert slots_full_in(held, MODEL) is False
        _wait_slots(server, 0)
    finally:
        host.close()


def test_every_probe_late_with_free_slots_is_late_and_new_sessions_are_served(
    served: tuple[TritonServer, str],
) -> None:
    """Probes whose deadline (1 ms) is shorter than any answer: each times out while the model's
    heartbeat moves and it has free slots: late, never busy or down; /healthz 200 and says so;
    a new session is admitted and streams (before this, busy: 503 "Video backend busy")."""
    server, key = served
    host = ProxyHost(server.grpc_url)
    try:
        proxy = host.server(
            model=MODEL,
            triton_key=key,
            triton_metrics_port=server.config.metrics_port,
            probe_interval=0.5,
            probe_timeout=0.001,
            probe_failures=1,
        )
        states: list[str] = []
        deadline = time.monotonic() + 60
        while True:  # starting, then late: the first probes time out
            status, health = _health(proxy.port)
            states.append(health.get("backend", ""))
            if health.get("backend") == "late" or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert health.get("backend") == "late", (states, health)
        assert status == 200, health
        assert "late, not busy" in (health["endpoints"][0]["last_error"] or ""), health

        async def body() -> list[str]:
            async with ws(proxy.url) as conn:  # upgraded: no 503
                s = Ws(conn)
                seen = [(await s.start("a harbour at dusk", seed=2))["type"]]
                while "video.chunk_metadata" not in seen:
                    seen.append((await s.next(60))["type"])
                await s.send({"type": "session.stop"})
                while seen[-1] != "session.done":
                    seen.append((await s.next(60))["type"])
                return seen

        seen = asyncio.run(asyncio.wait_for(body(), 120))
        assert seen[0] == "video.start" and seen[-1] == "session.done", seen
        for _ in range(5):  # and it stays late while the probes do, never busy or down
            states.append(_health(proxy.port)[1].get("backend", ""))
            time.sleep(0.3)
        assert not {"busy", "down", "restarting"} & set(states), states
        counts = metric_values(proxy.port)
        assert counts.get("rtvideo_proxy_probe_late_total", 0) >= 1, counts
        assert counts.get("rtvideo_proxy_probe_busy_total", 0) == 0, counts
    finally:
        host.close()
