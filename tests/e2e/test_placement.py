"""Many Triton servers behind one proxy: placement, retries, per-endpoint health, name resolution,
the drain on SIGTERM, and the device of a GPU model instance.

The real part: two real tritonservers (one on 127.0.0.1, one on 127.0.0.2, on the same gRPC port so
that one name can stand for both), models with `max_sessions` 2 at the shipped pacing, and real
proxies and WebSocket clients in front of them."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import types
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from rtvideo.proxy.observability.metrics import ProxyMetrics, by_label
from rtvideo.proxy.placement.addresses import parse_urls, split_address
from rtvideo.proxy.placement.bridge import BackendUnavailable
from rtvideo.proxy.placement.endpoint import capacity_of
from rtvideo.proxy.placement.placed_stream import PlacedStream
from rtvideo.proxy.placement.pool import EndpointPool
from rtvideo.proxy.placement.supervisor import BackendState
from rtvideo.triton.wire import START_TAG, Reply
from tests.support.http_calls import metric_values
from tests.support.processes import RTVIDEO, alive, descendants
from tests.support.serve_session import launch
from tests.support.streams import check_stream_rules, event_ends
from tests.support.triton_pair import (
    MODEL,
    Client,
    Host,
    LiveClient,
    Pair,
    healthz,
    restart,
    run,
    run_beside_main,
    wait_endpoints,
)


# --- addresses, capacity, device: no server -------------------------------------------------------
def test_triton_urls_are_checked() -> None:
    assert parse_urls("a:1, b:2,a:1") == ("a:1", "b:2")
    assert parse_urls(["a:1", "b:2,c:3"]) == ("a:1", "b:2", "c:3")
    assert split_address("[::1]:8001") == ("::1", 8001)
    for bad in ("a", "a:", ":1", "a:0", "a:99999", "http://a:1", "::1:8001", "[nope]:1", "a b:1", ""):
        with pytest.raises(ValueError):
            parse_urls(bad)


def test_capacity_is_max_sessions_times_instances() -> None:
    from tritonclient.grpc import model_config_pb2 as pb

    def config(max_sessions: str | None, *groups: tuple[int, int, list[int]]) -> Any:
        c = pb.ModelConfig(name=MODEL)
        if max_sessions is not None:
            c.parameters["max_sessions"].string_value = max_sessions
        for count, kind, gpus in groups:
            c.instance_group.add(count=count, kind=kind, gpus=gpus)
        return c

    gpu, cpu = pb.ModelInstanceGroup.KIND_GPU, pb.ModelInstanceGroup.KIND_CPU
    assert capacity_of(config("2", (1, cpu, []))) == 2
    assert capacity_of(config("4", (1, gpu, [0, 1, 2, 3]))) == 16  # one instance per GPU, 4 sessions each
    assert capacity_of(config("4", (2, gpu, [0, 1]), (1, cpu, []))) == 20
    assert capacity_of(config("3")) == 3
    assert capacity_of(config(None, (1, cpu, []))) is None
    assert capacity_of(config("many", (1, cpu, []))) is None


def test_a_gpu_instance_runs_on_its_own_gpu() -> None:
    from rtvideo.backend.builtin.devices import instance_device

    assert instance_device("auto", "GPU", "3") == "cuda:3"
    assert instance_device("cuda", "GPU", 1) == "cuda:1"
    assert instance_device("cuda:0", "GPU", "3") == "cuda:0"  # the parameter names a device: it wins
    assert instance_device("cpu", "GPU", "3") == "cpu"
    assert instance_device("auto", "CPU", "0") == "auto"
    assert instance_device("auto", "MODEL", "0") == "auto"
    with pytest.raises(ValueError):
        instance_device("auto", "GPU", "-1")


def test_model_py_gives_each_gpu_instance_its_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """`initialize` of the shipped model.py, with a stand-in `triton_python_backend_utils`: the
    settings it builds the session manager with carry the instance's GPU."""
    from rtvideo.triton.model_repo import MODEL_DIR

    class _Metric:
        def __init__(self, labels: dict) -> None:
            self.labels = labels

        def set(self, value: float) -> None: ...

        def increment(self, value: float) -> None: ...

        def observe(self, value: float) -> None: ...

    class _Family:
        GAUGE, COUNTER, HISTOGRAM = "gauge", "counter", "histogram"

        def __init__(self, name: str, doc: str, kind: str) -> None:
            self.labels: list[dict] = []

        def Metric(self, labels: dict, buckets: list[float] | None = None) -> _Metric:
            self.labels.append(labels)
            return _Metric(labels)

    fake = types.ModuleType("triton_python_backend_utils")
    fake.TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1  # type: ignore[attr-defined]
    fake.MetricFamily = _Family  # type: ignore[attr-defined]
    fake.using_decoupled_model_transaction_policy = lambda config: True  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", fake)
    spec = importlib.util.spec_from_file_location("rtvideo_model_under_test", MODEL_DIR / "1" / "model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    built: list[Any] = []

    class _Manager:
        active_sessions = 0  # read by the memory gauges at each metrics flush

        def on_request(self, *args: Any, **kwargs: Any) -> None: ...

        def serve_on(self, call_soon: Any) -> None: ...

        def shutdown(self) -> None: ...

    monkeypatch.setattr(
        module, "build_manager", lambda settings, name, metrics, **kw: built.append(settings) or _Manager()
    )

    def load(kind: str, device_id: str, device: str = "auto") -> str:
        config = {
            "model_transaction_policy": {"decoupled": True},
            "parameters": {"device": {"string_value": device}, "max_sessions": {"string_value": "4"}},
        }
        model = module.TritonPythonModel()
        model.initialize(
            {
                "model_config": json.dumps(config),
                "model_name": MODEL,
                "model_instance_kind": kind,
                "model_instance_device_id": device_id,
                "model_instance_name": f"{MODEL}_{device_id}",
            }
        )
        model.finalize()
        assert built[-1].max_sessions == 4  # per instance: every instance has its own manager
        return built[-1].device

    assert load("GPU", "0") == "cuda:0"
    assert load("GPU", "5") == "cuda:5"
    assert load("GPU", "5", device="cpu") == "cpu"
    assert load("CPU", "0") == "auto"


# --- placement with stand-in servers -------------------------------------------------------------
def _reply(tag: str, message: dict) -> Reply:
    return Reply(tag, json.dumps(message), message, b"")


BUSY = {"type": "error", "code": "server_busy", "message": "all 2 session slots are in use"}
BUSY_DONE = {
    "type": "session.done",
    "request_id": None,
    "chunks": 0,
    "stopped": False,
    "unapplied_event_ids": [],
    "unfinished_event_ids": [],
}


class _FakeStream:
    """A `TritonStream` whose server answers session.start as its endpoint's `mode` says."""

    def __init__(self, server: _FakeServer) -> None:
        self.server = server
        self.sequence_id = len(server.streams) + 1
        self.sent: list[tuple[bytes, bool, bool, str]] = []
        self._replies: asyncio.Queue[Reply | Exception | None] = asyncio.Queue()
        self.cancelled = False
        self.half_closed = False

    def send(self, raw: bytes, *, start: bool = False, end: bool = False) -> str:
        tag = START_TAG if start else f"m{len(self.sent) + 1}"
        self.sent.append((raw, start, end, tag))
        mode = self.server.mode
        if start and mode == "busy":
            self._replies.put_nowait(_reply(START_TAG, BUSY))
            self._replies.put_nowait(_reply(START_TAG, BUSY_DONE))
        elif start and mode == "ok":
            self._replies.put_nowait(_reply(START_TAG, {"type": "video.start", "request_id": f"r{self.sequence_id}"}))
        elif start and mode == "fail":
            self._replies.put_nowait(BackendUnavailable("Triton refused a request: unavailable"))
        elif end and mode != "silent":  # stands for the end being confirmed
            self._replies.put_nowait(_reply(tag, {"type": "session.done", "stopped": True}))
        elif not start and mode == "ok":
            self._replies.put_nowait(_reply(tag, {"type": "session.pong"}))
        return tag

    async def replies(self) -> AsyncIterator[Reply]:
        while (item := await self._replies.get()) is not None:
            if isinstance(item, Exception):
                raise item
            yield item

    def close_requests(self) -> None:
        """Half-close: a live server ends the call once every request completed."""
        self.half_closed = True
        if self.server.mode != "silent":
            self._replies.put_nowait(None)

    def cancel(self) -> None:
        self.cancelled = True
        self._replies.put_nowait(None)


class _FakeServer:
    def __init__(self, mode: str) -> None:
        self.mode = mode  # ok, busy, fail, silent
        self.streams: list[_FakeStream] = []

    def open_stream(self, patience: float = 0.0) -> _FakeStream:
        self.streams.append(_FakeStream(self))
        return self.streams[-1]

    async def close(self) -> None: ...


async def _pool(*modes: str, capacity: int = 2) -> tuple[EndpointPool, list[_FakeServer]]:
    urls = ",".join(f"10.0.0.{i + 1}:8001" for i in range(len(modes)))
    pool = EndpointPool(urls, MODEL, ProxyMetrics(), probe_interval=60, probe_timeout=1, probe_failures=1)
    await pool.refresh()  # IP addresses: no resolver; supervisors not started
    servers = []
    for endpoint, mode in zip(sorted(pool.endpoints.values(), key=lambda e: e.address), modes, strict=True):
        servers.append(_FakeServer(mode))
        endpoint.bridge = servers[-1]  # type: ignore[assignment]
        endpoint.capacity = capacity
        endpoint.supervisor.state = BackendState.UP
    return pool, servers


class _Reader:
    """One session's single pass over its stream's replies (as ProxySession._pump makes it)."""

    def __init__(self, stream: PlacedStream) -> None:
        self._replies = stream.replies().__aiter__()

    async def take(self, count: int) -> list[Reply]:
        return [await asyncio.wait_for(self._replies.__anext__(), 5) for _ in range(count)]


def test_most_free_slots_first_ties_rotate_full_ones_last() -> None:
    async def body() -> None:
        pool, _ = await _pool("ok", "ok", "ok")
        a, b, c = sorted(pool.endpoints.values(), key=lambda e: e.address)
        firsts = [pool.candidates()[0].address for _ in range(3)]
        assert sorted(firsts) == sorted(e.address for e in (a, b, c))  # equal: each in turn
        streams = [pool.open_stream() for _ in range(5)]  # 2 + 2 + 1
        assert sorted(len(e.streams) for e in (a, b, c)) == [1, 2, 2]
        assert [e.free for e in pool.candidates()] == [1]  # the only one with room
        streams.append(pool.open_stream())
        assert all(e.free == 0 for e in (a, b, c))
        assert len(pool.candidates()) == 1  # all full: one, whose model answers server_busy
        b.supervisor.state = BackendState.DOWN
        streams[0].cancel()
        streams[1].cancel()
        assert all(e is not b for e in pool.candidates())  # down: never a candidate
        c.leaving = True
        assert all(e is a for e in pool.candidates())  # leaving: no new sessions
        for s in streams:
            s.cancel()
        assert not a.streams and not b.streams

    asyncio.run(body())


def test_a_refused_start_is_replayed_on_the_next_endpoint_unseen() -> None:
    async def body() -> None:
        pool, (busy, ok) = await _pool("busy", "ok")
        busy_ep = next(e for e in pool.endpoints.values() if e.bridge is busy)
        ok_ep = next(e for e in pool.endpoints.values() if e.bridge is ok)
        ok_ep.capacity = 1  # so that the busy one (more free slots by this proxy's count) goes first
        stream = pool.open_stream()
        assert stream.endpoint is busy_ep
        assert stream.send(b"start", start=True) == START_TAG
        assert stream.send(b"ping") == "m2"  # sent before the start is answered: replayed too
        got = await _Reader(stream).take(2)
        assert [r.message["type"] for r in got] == ["video.start", "session.pong"]  # nothing of the refusal
        assert stream.endpoint is ok_ep and stream.placed and stream.attempts == 2
        assert [(raw, tag) for raw, _, _, tag in ok.streams[0].sent] == [(b"start", START_TAG), (b"ping", "m2")]
        refused = busy.streams[0]
        deadline = time.monotonic() + 30  # waited for, not assumed after a fixed sleep
        while not refused.cancelled and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert refused.sent[-1][2] is True and refused.cancelled  # that sequence was ended there, then dropped
        assert busy_ep.streams == set() and ok_ep.streams == {stream}
        stream.send(b"later")  # once placed, nothing more is kept for replay
        assert len(ok.streams[0].sent) == 3 and stream.replayable == 0
        metrics = pool.metrics
        assert by_label(metrics.endpoint_refusals, "endpoint") == {busy_ep.address: 1, ok_ep.address: 0}
        assert by_label(metrics.endpoint_placements, "endpoint") == {busy_ep.address: 0, ok_ep.address: 1}
        assert by_label(metrics.endpoint_sessions_active, "endpoint") == {busy_ep.address: 0, ok_ep.address: 1}
        stream.cancel()
        assert ok.streams[0].cancelled and not ok_ep.streams
        await pool.stop()

    asyncio.run(body())


def test_when_all_refuse_the_last_refusal_is_the_answer() -> None:
    async def body() -> None:
        pool, servers = await _pool("busy", "busy")
        stream = pool.open_stream()
        stream.send(b"start", start=True)
        got = await _Reader(stream).take(2)
        assert [r.message for r in got] == [BUSY, BUSY_DONE]
        assert stream.attempts == 2 and sum(len(s.streams) for s in servers) == 2
        assert sum(by_label(pool.metrics.endpoint_refusals, "endpoint").values()) == 2
        stream.cancel()
        await pool.stop()

    asyncio.run(body())


def test_a_failed_start_moves_on_and_all_failing_is_backend_unavailable() -> None:
    async def body() -> None:
        pool, (fail, ok) = await _pool("fail", "ok")
        next(e for e in pool.endpoints.values() if e.bridge is ok).capacity = 1
        stream = pool.open_stream()
        stream.send(b"start", start=True)
        assert [r.message["type"] for r in await _Reader(stream).take(1)] == ["video.start"]
        assert (
            fail.streams[0].cancelled and sum(by_label(pool.metrics.endpoint_start_failures, "endpoint").values()) == 1
        )
        stream.cancel()

        pool, _ = await _pool("fail", "fail")
        stream = pool.open_stream()
        stream.send(b"start", start=True)
        with pytest.raises(BackendUnavailable, match="no Triton endpoint could start the session"):
            await _Reader(stream).take(1)
        assert not any(e.streams for e in pool.endpoints.values())

        pool, _ = await _pool("ok")
        next(iter(pool.endpoints.values())).supervisor.state = BackendState.DOWN  # no endpoint takes it
        stream = pool.open_stream()
        assert stream.send(b"start", start=True) == START_TAG and stream.send(b"x") == "m2"
        with pytest.raises(BackendUnavailable, match="no Triton endpoint takes new sessions"):
            await _Reader(stream).take(1)

    asyncio.run(body())


def test_an_endpoint_going_down_ends_placed_sessions_and_moves_pending_ones() -> None:
    async def body() -> None:
        pool, (silent, ok) = await _pool("silent", "ok")
        silent_ep = next(e for e in pool.endpoints.values() if e.bridge is silent)
        ok_ep = next(e for e in pool.endpoints.values() if e.bridge is ok)
        ok_ep.capacity = 1
        pending = pool.open_stream()  # on the silent one: its start is never answered
        pending.send(b"start", start=True)
        reader = _Reader(pending)
        took = asyncio.ensure_future(reader.take(1))
        await asyncio.sleep(0.01)
        assert pending.endpoint is silent_ep
        pool.down(silent_ep, "stub gone")
        assert [r.message["type"] for r in await took] == ["video.start"] and pending.endpoint is ok_ep

        pool.down(ok_ep, "stub gone too")  # now placed: it ends
        with pytest.raises(BackendUnavailable, match="stub gone too"):
            await reader.take(1)
        pending.cancel()
        assert not ok_ep.streams

    asyncio.run(body())


def test_names_resolve_to_endpoints_that_join_and_leave() -> None:
    async def body() -> None:
        answers: dict[str, list[str]] = {"tritons.test": ["10.1.0.1"]}
        failing = False

        async def resolver(host: str, port: int) -> list[str]:
            if failing:
                raise OSError("DNS is away")
            return answers[host]

        pool = EndpointPool(
            "tritons.test:8001,10.9.9.9:8001",
            MODEL,
            ProxyMetrics(),
            probe_interval=60,
            probe_timeout=1,
            probe_failures=1,
            resolver=resolver,
        )
        await pool.refresh()
        assert sorted(pool.endpoints) == ["10.1.0.1:8001", "10.9.9.9:8001"]
        answers["tritons.test"] = ["10.1.0.1", "10.1.0.2", "10.1.0.2"]
        await pool.refresh()
        assert sorted(pool.endpoints) == ["10.1.0.1:8001", "10.1.0.2:8001", "10.9.9.9:8001"]
        for e in pool.endpoints.values():
            e.supervisor.state = BackendState.UP
        stream = PlacedStream(pool, [pool.endpoints["10.1.0.1:8001"]])  # a session stays on it
        failing = True
        await pool.refresh()  # a failed resolution removes nothing
        assert len(pool.endpoints) == 3
        failing = False
        answers["tritons.test"] = ["10.1.0.2"]
        await pool.refresh()
        gone = pool.endpoints["10.1.0.1:8001"]
        assert gone.leaving and not gone.admitting and gone.streams == {stream}
        assert all(e is not gone for e in pool.candidates())
        assert [e["endpoint"] for e in pool.status()["endpoints"] if e["leaving"]] == ["10.1.0.1:8001"]
        stream.cancel()  # its last session ends: it is gone
        assert sorted(pool.endpoints) == ["10.1.0.2:8001", "10.9.9.9:8001"]
        assert "10.1.0.1:8001" not in by_label(pool.metrics.endpoint_sessions_active, "endpoint")
        await pool.stop()

    asyncio.run(body())


# --- two real tritonservers -----------------------------------------------------------------------


def test_sessions_fill_both_servers_then_server_busy(pair: Pair, host: Host) -> None:
    server = host.proxy(f"{pair.a},{pair.b}", max_sessions_per_client=8)  # one address fills them on purpose
    health = wait_endpoints(server, {pair.a: "up", pair.b: "up"})
    assert health["ready"] and health["backend"] == "up"

    async def body() -> None:
        clients = [await Client.open(server.url) for _ in range(4)]
        assert all(c.request_id for c in clients), [c.t.messages for c in clients]
        placed = host.placements(server)
        assert sorted(placed.values()) == sorted([pair.a, pair.a, pair.b, pair.b]), placed
        fifth = await Client.open(server.url)
        assert [m["type"] for m in fifth.t.messages] == ["error"] and fifth.t.messages[0]["code"] == "server_busy"
        assert (await fifth.next())["type"] == "session.done"
        values = metric_values(server.port)
        for url in (pair.a, pair.b):
            assert values[f'rtvideo_proxy_endpoint_sessions_active{{endpoint="{url}"}}'] == 2
            assert values[f'rtvideo_proxy_endpoint_placements_total{{endpoint="{url}"}}'] == 2
            assert values[f'rtvideo_proxy_endpoint_up{{endpoint="{url}"}}'] == 1
            assert values[f'rtvideo_proxy_endpoint_capacity{{endpoint="{url}"}}'] == 2
        assert values['rtvideo_proxy_errors_total{code="server_busy"}'] == 1
        assert sum(values[f'rtvideo_proxy_endpoint_refusals_total{{endpoint="{u}"}}'] for u in (pair.a, pair.b)) == 1
        for c in clients:
            await c.media()
        await asyncio.gather(*(c.stop() for c in clients))
        await fifth.conn.close()

    run(body())
    health = healthz(server)
    assert [(e["endpoint"], e["sessions"], e["free"]) for e in health["endpoints"]] == [(pair.a, 0, 2), (pair.b, 0, 2)]


def test_a_server_filled_by_another_client_is_passed_over_unnoticed(pair: Pair, host: Host) -> None:
    from rtvideo.client.triton_stream import TritonStreamSession

    server = host.proxy(f"{pair.a},{pair.b}")
    wait_endpoints(server, {pair.a: "up", pair.b: "up"})
    direct = [TritonStreamSession(pair.a, MODEL) for _ in range(2)]  # A is full, unknown to the proxy
    try:
        for d in direct:
            d.start("someone else's session")
            assert d.next().message["type"] == "video.start"

        async def body() -> list[Client]:
            clients = [await Client.open(server.url) for _ in range(2)]
            for c in clients:  # the first thing each sees is its video.start: no error, no refusal
                assert c.request_id and c.t.messages[0]["type"] == "video.start", c.t.messages
                await c.media()
            assert sorted(host.placements(server).values()) == [pair.b, pair.b]
            await asyncio.gather(*(c.stop() for c in clients))
            return clients

        run(body())
        refusals = by_label(server.context.metrics.endpoint_refusals, "endpoint")
        assert refusals[pair.a] >= 1 and refusals[pair.b] == 0, refusals
        assert by_label(server.context.metrics.errors, "code")["server_busy"] == 0
    finally:
        for d in direct:
            d.stop()
            d.close()


def test_a_killed_servers_session_moves_to_the_other_and_it_comes_back(pair: Pair, host: Host) -> None:
    """kill -9 of one server: its session goes on on the other (docs/recordings.md "Moves"), with
    no error and no gap; the other's is untouched; new sessions find the survivor full and get
    server_busy; once restarted, the killed one takes sessions again."""
    server = host.proxy(f"{pair.a},{pair.b}", max_sessions_per_client=8)  # one address fills them on purpose
    wait_endpoints(server, {pair.a: "up", pair.b: "up"})
    a = pair.servers["127.0.0.1"]
    timings: dict[str, float] = {}

    async def body(in_main: Callable[[Callable[[], Any]], Awaitable[Any]]) -> None:
        first = [await LiveClient.live(server.url) for _ in range(2)]
        placed = host.placements(server)
        assert sorted(placed.values()) == [pair.a, pair.b]
        on_a = next(c for c in first if placed[c.request_id] == pair.a)
        on_b = next(c for c in first if placed[c.request_id] == pair.b)
        await on_a.media()
        await on_b.media()
        os.killpg(a.pid, signal.SIGKILL)  # tritonserver and its stub
        t0 = time.monotonic()
        await on_a.media(2)  # it goes on, now on B
        timings["moved session's next chunk"] = time.monotonic() - t0
        assert host.placements(server)[on_a.request_id] == pair.b
        transport = [m["transport_chunk_index"] for m in on_a.t.media]
        generation = [m["generation_chunk_index"] for m in on_a.t.media]
        assert transport == list(range(len(transport))) and generation == list(range(len(generation)))
        assert not on_a.t.of_type("error") and len(on_a.t.of_type("video.start")) == 1
        await on_b.media(2)  # the other server's session goes on
        while (await asyncio.to_thread(healthz, server))["endpoints"][0]["state"] != "down":
            assert time.monotonic() - t0 < 60
            await asyncio.sleep(0.1)
        timings["endpoint down"] = time.monotonic() - t0
        full = await Client.open(server.url)  # B holds both sessions, A is down: busy
        assert full.t.messages[0]["code"] == "server_busy"
        await full.conn.close()
        assert not on_b.t.of_type("error")

        t1 = time.monotonic()
        await in_main(lambda: restart(a))  # on the same ports
        timings["restart"] = time.monotonic() - t1
        await asyncio.to_thread(wait_endpoints, server, {pair.a: "up", pair.b: "up"})
        timings["back in rotation"] = time.monotonic() - t1
        back = await LiveClient.live(server.url)  # B is full: only A can take it
        assert back.request_id and host.placements(server)[back.request_id] == pair.a
        await asyncio.gather(*(c.stop() for c in (on_a, on_b, back)))
        timings["longest wait of the moved session"] = on_a.longest_wait
        done = on_a.t.of_type("session.done")[-1]
        assert done["chunks"] == len(on_a.t.pairs) and not on_a.t.of_type("error")
        check_stream_rules(on_a.t)  # one request id, acks before mentions, the stream decodes as one
        assert metric_values(server.port)['rtvideo_proxy_sessions_moved_total{reason="loss"}'] == 1

    try:
        run_beside_main(body)
    finally:
        if not a.is_alive():
            restart(a)
    print("after the kill -9 of one tritonserver:", ", ".join(f"{k} {v:.2f} s" for k, v in timings.items()))


def test_a_name_that_resolves_to_both_servers_gives_two_endpoints(pair: Pair, host: Host) -> None:
    addresses = ["127.0.0.1"]

    async def resolver(name: str, port: int) -> list[str]:
        assert name == "tritons.test"
        return list(addresses)

    server = host.proxy(f"tritons.test:{pair.port}", resolver=resolver, resolve_interval=0.2, max_sessions_per_client=8)
    wait_endpoints(server, {pair.a: "up"})
    addresses.append("127.0.0.2")
    wait_endpoints(server, {pair.a: "up", pair.b: "up"})

    async def body() -> None:
        clients = [await Client.open(server.url) for _ in range(2)]
        assert sorted(host.placements(server).values()) == [pair.a, pair.b]
        addresses.remove("127.0.0.1")  # A leaves the name: its session runs on, new ones go to B
        deadline = time.monotonic() + 10
        while not any(e["leaving"] for e in healthz(server)["endpoints"]):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)
        extra = await Client.open(server.url)
        assert host.placements(server)[extra.request_id] == pair.b
        for c in clients:
            await c.media()
        await asyncio.gather(*(c.stop() for c in (*clients, extra)))

    run(body())
    wait_endpoints(server, {pair.b: "up"})  # gone once its last session ended


# --- the drain on SIGTERM -------------------------------------------------------------------------
def test_sigterm_drains_then_ends_the_rest_with_server_shutdown(pair: Pair, tmp_path: Path) -> None:
    # The drain is long enough that the short session, started before the SIGTERM, is still
    # running when it comes on a loaded machine too, and ends within the drain.
    drain = 6.0
    served = launch(
        tmp_path,
        *("--triton-url", pair.a, "--triton-url", pair.b, "--model", MODEL),
        *("--drain-seconds", str(drain), "--probe-interval", "0.5"),
        own_triton=False,
    )
    proc, url, log = served.proc, served.url, served.log

    def status(path: str) -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{served.port}{path}", timeout=5) as resp:
                return resp.status
        except urllib.error.HTTPError as err:
            return err.code

    try:
        assert served.ready_line(60).startswith("rtvideo ready:"), log.read_text()
        deadline = time.monotonic() + 30
        while status("/readyz") != 200:
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        timings: dict[str, float] = {}

        async def body() -> tuple[Client, Client]:
            short = await Client.open(url, num_frames=72)  # 8 chunks, 4.5 s at real time: ends within the drain

            async def ended() -> tuple[dict, float]:
                return await short.until("session.done", timeout=20), time.monotonic()

            short_end = asyncio.ensure_future(ended())
            long = await Client.open(url)
            await long.media()
            await long.conn.send(
                json.dumps(
                    {
                        "type": "session.interaction",
                        "interaction": {"event_id": "slow", "transition_chunks": 50, "event": {"prompt": "a storm"}},
                    }
                )
            )
            await long.until("session.interaction.queued")
            proc.send_signal(signal.SIGTERM)
            t0 = time.monotonic()
            while await asyncio.to_thread(status, "/readyz") != 503:  # at once: well within the drain
                assert time.monotonic() - t0 < drain / 2, "/readyz not 503 at once"
            timings["readyz 503"] = time.monotonic() - t0
            assert await asyncio.to_thread(status, "/livez") == 200
            with pytest.raises(InvalidStatus) as refused:
                await connect(url)
            assert refused.value.response.status_code == 503
            assert not short_end.done(), "the short session ended before the SIGTERM"
            done, at = await short_end
            assert done["stopped"] is False and not short.t.of_type("error")
            assert await short.closed() == 1000
            timings["short session done"] = at - t0
            error = await long.until("error", timeout=drain + 30)
            timings["server_shutdown"] = time.monotonic() - t0
            assert error["code"] == "server_shutdown"
            assert await long.closed() == 1001
            return short, long

        _short, long = run(body(), timeout=120)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    print("from SIGTERM:", ", ".join(f"{k} {v:.2f} s" for k, v in timings.items()))
    assert drain <= timings["server_shutdown"] < drain + 10, timings  # at the drain's end, not before
    done = long.t.messages[-1]
    assert done["type"] == "session.done" and done["chunks"] == len(long.t.pairs) and done["stopped"] is False
    assert "slow" in event_ends(long.t)
    assert [m["type"] for m in long.t.messages if m["type"] != "video.chunk_metadata"][-2:] == ["error", "session.done"]
    assert not [p for p in descendants(proc.pid) if alive(p)]


@pytest.mark.parametrize(
    "args,env,fragment",
    [
        (["--triton-url", "127.0.0.1:8001", "--triton-url", "http://b:8001"], {}, "Triton URL 'http://b:8001'"),
        ([], {"RTVIDEO_TRITON_URL": "127.0.0.1:8001,nope"}, "Triton URL 'nope'"),
        (["--triton-url", "127.0.0.1:8001", "--drain-seconds", "-1"], {}, "drain_seconds must be >= 0"),
        (["--triton-url", "127.0.0.1:8001", "--move-patience-seconds", "-1"], {}, "move_patience_seconds must be >= 0"),
    ],
)
def test_bad_triton_urls_give_one_line_and_exit_2(args: list[str], env: dict[str, str], fragment: str) -> None:
    out = subprocess.run(
        [str(RTVIDEO), "serve", *args], capture_output=True, text=True, timeout=60, env={**os.environ, **env}
    )
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0] and "Traceback" not in out.stderr, out.stderr
