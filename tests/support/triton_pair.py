"""Two real tritonservers behind real proxies (tests/e2e/test_placement.py, test_moves.py): one
on 127.0.0.1 and one on 127.0.0.2, on the same gRPC port so that one name can stand for both;
a background loop hosting the proxies; a WebSocket client that records what it receives."""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import json
import queue
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from tests.support.proxy_client import NO_KEEPALIVE, Ws

T = TypeVar("T")
MODEL = "realtime_video"  # max_sessions 2 at the shipped pacing
ROOMY_MODEL = "realtime_video_roomy"  # max_sessions 8: one server holds every session of the other


def port_free_on(port: int, *hosts: str) -> bool:
    for host in hosts:
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                return False
    return True


class Pair:
    """Triton A on 127.0.0.1 and B on 127.0.0.2, on the same gRPC port."""

    def __init__(self, tmp: Path) -> None:
        from rtvideo.triton.command import TritonConfig
        from rtvideo.triton.model_repo import derive_model
        from rtvideo.triton.server import TritonServer, free_port

        repo = tmp / "repo"
        derive_model(repo, MODEL, {"max_sessions": "2"})  # the shipped pacing: sessions stay live
        derive_model(repo, ROOMY_MODEL, {"max_sessions": "8"})  # room for every session of a move
        while not port_free_on(port := free_port(), "127.0.0.1", "127.0.0.2"):
            pass
        self.port = port
        self.servers = {
            host: TritonServer(
                TritonConfig(repo, grpc_port=port, http_port=free_port(), metrics_port=free_port(), host=host),
                stdout=tmp / f"triton-{host}.log",
            )
            for host in ("127.0.0.1", "127.0.0.2")
        }

    def url(self, host: str) -> str:
        return f"{host}:{self.port}"

    @property
    def a(self) -> str:
        return self.url("127.0.0.1")

    @property
    def b(self) -> str:
        return self.url("127.0.0.2")

    def start(self) -> None:
        """Spawn both from this (the main) thread, then wait for both: they start in parallel."""
        for server in self.servers.values():
            if not server.is_alive():
                server.spawn()
        for server in self.servers.values():
            server.wait_ready(300)

    def stop(self) -> None:
        for server in self.servers.values():
            server.stop()


class Host:
    """A background event loop hosting proxies (ProxyServer), like tests/support/proxy_host.py's."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="proxy-loop", daemon=True)
        self._thread.start()
        self.servers: list[Any] = []

    def call(self, coro: Awaitable[T], timeout: float = 60.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)  # type: ignore[arg-type]

    def proxy(self, urls: str, resolver: Any = None, **overrides: Any) -> Any:
        from rtvideo.proxy.app import ProxyServer
        from rtvideo.proxy.settings import ProxySettings

        base = {"port": 0, "triton_url": urls, "model": MODEL, "probe_interval": 0.5, "probe_failures": 2}
        settings = ProxySettings(**{**base, **overrides})

        async def start() -> ProxyServer:
            server = ProxyServer(settings, resolver=resolver)
            await server.start()
            return server

        server = self.call(start())
        self.servers.append(server)
        return server

    def placements(self, server: Any) -> dict[str, str]:
        """request_id → endpoint of every live session of `server`."""

        async def read() -> dict[str, str]:
            return {
                s.request_id: s.upstream.stream.endpoint.address
                for s in server.context.sessions
                if s.request_id and s.upstream.stream is not None and s.upstream.stream.endpoint is not None
            }

        return self.call(read())

    def close(self) -> None:
        for server in self.servers:
            self.call(server.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


def healthz(server: Any) -> dict:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/healthz", timeout=10) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return json.loads(err.read())


def wait_endpoints(server: Any, want: dict[str, str], timeout: float = 60.0, capacity: int = 2) -> dict:
    """Until /healthz shows exactly these endpoints in these states (and `capacity` when up) and,
    when one is up, Triton's own readiness (its first call on a channel a supervisor has just
    renewed is cancelled with that channel: "not ready" for a moment at the proxy's start)."""
    deadline = time.monotonic() + timeout
    while True:
        health = healthz(server)
        got = {e["endpoint"]: e["state"] for e in health["endpoints"]}
        capacities_read = all(e["capacity"] == capacity for e in health["endpoints"] if e["state"] == "up")
        ready_read = health["ready"] or "up" not in want.values()
        if got == want and capacities_read and ready_read:
            return health
        assert time.monotonic() < deadline, f"endpoints {got}, wanted {want}: {health}"
        time.sleep(0.1)


class Client(Ws):
    """One WebSocket session, recording what it receives, and its request id once started."""

    def __init__(self, conn: ClientConnection) -> None:
        super().__init__(conn)
        self.request_id: str | None = None

    @classmethod
    async def open(cls, url: str, **start: Any) -> Client:
        client = cls(await connect(url, max_size=None, **NO_KEEPALIVE))
        await client.send({"type": "session.start", "prompt": "a harbour at dawn", **start})
        first = await client.next()
        if first["type"] == "video.start":
            client.request_id = first["request_id"]
        return client

    async def media(self, count: int = 1) -> None:
        for _ in range(count):
            while (await self.next())["type"] != "video.chunk_metadata" or self.t.pairs[-1][0]["kind"] != "media":
                pass

    async def closed(self, timeout: float = 20.0) -> int | None:
        """Read to the end; the close code."""
        with pytest.raises(ConnectionClosed):
            while True:
                await self.next(timeout)
        return self.conn.close_code

    async def stop(self) -> None:
        await self.send({"type": "session.stop"})
        await self.until("session.done")
        await self.conn.close()


class LiveClient(Client):
    """A client that reads all the time, as a player does (one that stops reading is a slow
    consumer, and its unanswered pings end it), timing every media chunk's arrival."""

    arrivals: list[float]
    _reader: asyncio.Task

    @classmethod
    async def live(cls, url: str, **start: Any) -> LiveClient:
        client = await cls.open(url, **start)
        assert isinstance(client, LiveClient)
        client.arrivals = []
        client._reader = asyncio.create_task(client._read())
        return client

    async def _read(self) -> None:
        while (message := await super().next(120.0))["type"] != "session.done":
            if message["type"] == "video.chunk_metadata" and message["kind"] == "media":
                self.arrivals.append(time.monotonic())

    async def media(self, count: int = 1) -> None:
        """Until `count` more media chunks arrived."""
        want = len(self.arrivals) + count
        while len(self.arrivals) < want:
            assert not self._reader.done(), self._reader
            await asyncio.sleep(0.02)

    async def done(self, timeout: float = 60.0) -> None:
        await asyncio.wait_for(self._reader, timeout)

    async def stop(self) -> None:
        await self.conn.send(json.dumps({"type": "session.stop"}))
        await self.done()
        await self.conn.close()

    @property
    def longest_wait(self) -> float:
        """The longest time between two media chunks' arrivals."""
        return max(b - a for a, b in itertools.pairwise(self.arrivals))


def run(coro: Awaitable[T], timeout: float = 180.0) -> T:
    return asyncio.run(asyncio.wait_for(coro, timeout))  # type: ignore[arg-type]


def run_beside_main(
    body: Callable[[Callable[[Callable[[], Any]], Awaitable[Any]]], Awaitable[T]], timeout: float = 400.0
) -> T:
    """`run(body(in_main))` on a thread; `await in_main(fn)` runs `fn` on this, the main, thread
    (a tritonserver dies with the thread that spawned it, so it is spawned from here)."""
    jobs: queue.Queue = queue.Queue()
    result: dict[str, Any] = {}

    async def in_main(fn: Callable[[], Any]) -> Any:
        future: concurrent.futures.Future = concurrent.futures.Future()
        jobs.put((fn, future))
        return await asyncio.wrap_future(future)

    def target() -> None:
        try:
            result["value"] = run(body(in_main), timeout)
        except BaseException as exc:  # noqa: BLE001 - re-raised on the main thread
            result["error"] = exc
        finally:
            jobs.put(None)

    thread = threading.Thread(target=target, name="client-loop")
    thread.start()
    while (job := jobs.get()) is not None:
        fn, future = job
        try:
            future.set_result(fn())
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting body
            future.set_exception(exc)
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["value"]


def restart(server: Any) -> None:
    """Stop and start a tritonserver on its ports. tritonserver 2.51 (the pytriton wheel) now and
    then dies of SIGSEGV while starting right after a kill -9 freed the same ports (seen twice
    in a few dozen restarts here); that crash is Triton's, not the placement's under test, so
    one such start is tried again."""
    server.stop()
    try:
        server.start(300)
    except RuntimeError as exc:
        if "exited with code -" not in str(exc):
            raise
        server.stop()
        server.start(300)
