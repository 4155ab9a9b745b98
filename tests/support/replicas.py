"""Proxy replicas as real processes: N `rtvideo serve --triton-url` of one deployment sharing one
session store, behind a load balancer (tests/support/tcp_relay.py), each on a port of its own
that it keeps across restarts. A test or a benchmark kills one (`kill9`: SIGKILL of that proxy
alone; the Triton is another process), stops one as a deploy does (`sigterm`: the exit code
and how long it took) and starts it again on the same port (`restart`).

    with Replicas(tmp, triton.grpc_url, redis_url, model=MODEL) as replicas:
        async with RealtimeVideoClient(replicas.url) as client:  # through the balancer
            ...
            replicas.kill9(replicas.holding()[0])

The store URL reaches each proxy as `RTVIDEO_SESSION_STORE` (it may carry a password: never on
a command line), the Triton key as `RTVIDEO_TRITON_KEY` from this process's environment (the
`triton` fixture puts it there; benchmarks: bench_common.triton_key). Each replica's standard
error goes to `proxy-<i>.log` in the given directory, every run appended after a header line;
its standard output (the one ready line) to `proxy-<i>.out`.

The balancer and every proxy process belong to one thread of this harness (its loop): the
proxies are started behind rtvideo.process.launch from it, so they die with it, even when the
process that runs the test is killed."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple, TypeVar

from rtvideo.process import launch
from rtvideo.triton.access import KEY_ENV
from rtvideo.triton.server import free_port
from tests.support.http_calls import metric_values
from tests.support.tcp_relay import TcpRelay

T = TypeVar("T")

READY_LINE = "rtvideo ready: "
#: a replica is ready once its backend is known: up, or busy (every Triton slot held: a full
#: Triton is a healthy one, and a resume may still be taken over when a slot frees)
KNOWN_BACKEND = ("up", "busy")


class Exit(NamedTuple):
    """How a replica's process ended after SIGTERM: its exit code (-9: it did not exit within the
    bound and was killed) and the seconds from the signal to its exit."""

    code: int
    seconds: float


class Replica:
    """One replica: its port (the same across restarts), its process now, its logs and, for each
    run that ended, the metrics it showed just before its end (a restart starts them at zero)."""

    def __init__(self, index: int, directory: Path) -> None:
        self.index = index
        self.port = free_port()
        self.log = directory / f"proxy-{index}.log"
        self.out = directory / f"proxy-{index}.out"
        self.proc: subprocess.Popen[bytes] | None = None
        self.runs = 0
        #: each ended run's last /metrics, in order (see `Replicas.sigterm`, `Replicas.kill9`)
        self.ended_metrics: list[dict[str, float]] = []

    @property
    def url(self) -> str:
        """Its own WebSocket URL (not through the balancer)."""
        return f"ws://127.0.0.1:{self.port}/v1/realtime/video"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def get(self, path: str, timeout: float = 10) -> tuple[int, bytes]:
        """GET `path` of it: status and body (an error status too); OSError when nothing answers."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=timeout) as reply:
                return reply.status, reply.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()

    def metrics(self) -> dict[str, float]:
        """Its /metrics now: each sample (name and labels) with its value."""
        return metric_values(self.port)

    def metric(self, name: str, label: str = "") -> float:
        """A sample's value summed over its series (0 when none); `label` (e.g. 'reason="expired"')
        keeps only the series that carry it."""
        return sum(v for k, v in self.metrics().items() if k.split("{")[0] == name and label in k)

    def sessions_active(self) -> int:
        return int(self.metric("rtvideo_proxy_sessions_active"))

    def tail(self, chars: int = 4000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"


class _LoopThread:
    """A thread running one asyncio loop: the balancer relays on it, and the proxies are spawned
    from it (they die with it: rtvideo.process.launch)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="replicas-loop", daemon=True)
        self._thread.start()

    def call(self, coro: Awaitable[T], timeout: float = 30.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)  # type: ignore[arg-type]

    def run(self, fn: Callable[[], T]) -> T:
        """`fn()` on the loop's thread."""

        async def call() -> T:
            return fn()

        return self.call(call())

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


class Replicas:
    """`count` proxy processes in front of `triton_url` (serving `model`) sharing the session
    store `store` (a redis:// URL, or "memory": replicas that share nothing), behind a balancer.
    `flags`: more `rtvideo serve` flags for each; `triton_metrics_port`: that Triton's metrics
    port, where a proxy reads the model's heartbeat (0: not read; then a replica started while
    every slot of the Triton is held is never seen ready: its probe gets no answer)."""

    def __init__(
        self,
        directory: Path,
        triton_url: str,
        store: str,
        *,
        model: str,
        count: int = 2,
        flags: Sequence[str] = (),
        triton_metrics_port: int = 0,
        env: Mapping[str, str] | None = None,
        ready_seconds: float = 120.0,
        keyed: bool = True,
    ) -> None:
        if keyed and not os.environ.get(KEY_ENV) and not (env or {}).get(KEY_ENV):
            raise RuntimeError(f"no Triton key: {KEY_ENV} must be set (the `triton` fixture, bench_common.triton_key)")
        self.triton_url, self.model, self.flags = triton_url, model, tuple(flags)
        self.triton_metrics_port = triton_metrics_port
        self.ready_seconds = ready_seconds
        self._env = {**os.environ, **(env or {}), "RTVIDEO_SESSION_STORE": store}
        if not keyed:  # a Triton started without a key (tests/support/triton_pair.py, omni_triton.py)
            self._env.pop(KEY_ENV, None)
        directory.mkdir(parents=True, exist_ok=True)
        self.replicas = [Replica(i, directory) for i in range(count)]
        self.balancer = TcpRelay([r.port for r in self.replicas])
        self._loop: _LoopThread | None = None

    # --- the deployment ---------------------------------------------------------------------------
    @property
    def url(self) -> str:
        """The WebSocket URL of the balancer: what clients use."""
        return f"ws://127.0.0.1:{self.balancer.port}/v1/realtime/video"

    def __getitem__(self, index: int) -> Replica:
        return self.replicas[index]

    def __len__(self) -> int:
        return len(self.replicas)

    def start(self) -> Replicas:
        """Every replica started and ready, then the balancer listening."""
        self._loop = _LoopThread()
        for replica in self.replicas:
            self._spawn(replica)
        for replica in self.replicas:
            self.wait_ready(replica.index)
        self._loop.call(self.balancer.up())
        return self

    def close(self) -> None:
        """Everything this harness started is gone: the balancer, then each replica (SIGKILL:
        a shutdown the test wanted to see is `sigterm`'s)."""
        if self._loop is None:
            return
        try:
            self._loop.call(self.balancer.down())
        finally:
            for replica in self.replicas:
                if replica.proc is not None and replica.proc.poll() is None:
                    replica.proc.kill()
                    replica.proc.wait()
            self._loop.close()
            self._loop = None

    def __enter__(self) -> Replicas:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- one replica --------------------------------------------------------------------------------
    def kill9(self, index: int) -> None:
        """SIGKILL of replica `index`'s proxy process (its Triton is not its child), reaped."""
        replica = self._running(index)
        self._keep_metrics(replica)
        assert replica.proc is not None
        replica.proc.kill()
        replica.proc.wait()

    def sigterm(self, index: int, timeout: float = 90.0) -> Exit:
        """SIGTERM to replica `index` (as a deploy stops it), and its exit within `timeout`
        seconds; past it, SIGKILL (the code is then -9)."""
        replica = self._running(index)
        self._keep_metrics(replica)
        assert replica.proc is not None
        began = time.monotonic()
        replica.proc.send_signal(signal.SIGTERM)
        try:
            code = replica.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            replica.proc.kill()
            code = replica.proc.wait()
        return Exit(code, time.monotonic() - began)

    def restart(self, index: int) -> None:
        """Replica `index` started again on its port (its process must have ended), and ready."""
        replica = self.replicas[index]
        if replica.alive:
            raise RuntimeError(f"replica {index} still runs: kill9 or sigterm it first")
        self._spawn(replica)
        self.wait_ready(index)

    def wait_ready(self, index: int) -> None:
        """Until replica `index` printed its ready line and knows its backend (`KNOWN_BACKEND`);
        RuntimeError, with its log, when it exits or takes longer than `ready_seconds`."""
        replica = self.replicas[index]
        deadline = time.monotonic() + self.ready_seconds
        while not self._ready(replica):
            if not replica.alive or time.monotonic() > deadline:
                state = "exited" if not replica.alive else f"not ready within {self.ready_seconds:g} s"
                raise RuntimeError(f"replica {index} {state}; its log:\n{replica.tail()}")
            time.sleep(0.1)

    def holding(self) -> list[int]:
        """The live replicas with a session open now (`rtvideo_proxy_sessions_active` > 0)."""
        return [r.index for r in self.replicas if r.alive and r.sessions_active() > 0]

    # --- inside ---------------------------------------------------------------------------------
    def _running(self, index: int) -> Replica:
        replica = self.replicas[index]
        if not replica.alive:
            raise RuntimeError(f"replica {index} is not running")
        return replica

    @staticmethod
    def _keep_metrics(replica: Replica) -> None:
        """Its metrics before its end: what it did (takeovers, their times) dies with it."""
        try:
            replica.ended_metrics.append(replica.metrics())
        except OSError:
            replica.ended_metrics.append({})

    def _argv(self, replica: Replica) -> list[str]:
        return [
            sys.executable, "-m", "rtvideo.cli", "serve",
            "--triton-url", self.triton_url,
            "--triton-metrics-port", str(self.triton_metrics_port),
            "--model", self.model,
            "--port", str(replica.port),
            "--health-port", "off",
            *self.flags,
        ]  # fmt: skip

    def _spawn(self, replica: Replica) -> None:
        assert self._loop is not None, "start() first"
        replica.runs += 1
        with replica.log.open("ab") as log:
            log.write(f"=== replicas: run {replica.runs} of proxy {replica.index} on port {replica.port}\n".encode())
            log.flush()
            with replica.out.open("wb") as out:
                argv = launch.command(self._argv(replica))
                replica.proc = self._loop.run(
                    lambda: subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=log, env=self._env)
                )

    @staticmethod
    def _ready(replica: Replica) -> bool:
        try:
            if not replica.out.read_text().startswith(READY_LINE):
                return False
            _, body = replica.get("/readyz", timeout=5)
        except OSError:
            return False
        try:
            return json.loads(body).get("backend") in KNOWN_BACKEND
        except ValueError:
            return False
