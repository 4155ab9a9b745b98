"""What placement over several Triton servers costs: session start latency through the proxy.

Starts two tritonservers (127.0.0.1 and 127.0.0.2, the same gRPC port; models with
`max_sessions` 2 at the shipped pacing) and `rtvideo serve --triton-url …` proxies as their own
processes. One session at a time: connect → session.start → `video.start` received, then
session.stop and the close. Measures:

- start latency through a proxy with one endpoint, and with two;
- a retried placement: server A is full (two sessions another client opened over gRPC, unknown
  to the proxy), so a session whose first choice is A is refused there (`server_busy`, unseen by
  the client) and replayed on B. Which sessions were retried is read from the proxy's
  `rtvideo_proxy_endpoint_refusals_total`; samples are spaced past the proxy's hold on an
  endpoint that refused, so that A is again a first choice.

Prints figures; asserts nothing.   .venv/bin/python benchmarks/bench_placement.py [--samples 30]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import select
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench_common import percentile, triton_key
from websockets.asyncio.client import connect

from rtvideo.client.triton_stream import TritonStreamSession
from rtvideo.proxy.placement.pool import REFUSED_HOLD_SECONDS
from rtvideo.triton.command import TritonConfig
from rtvideo.triton.model_repo import derive_model
from rtvideo.triton.server import TritonServer, free_port

MODEL = "realtime_video"


def _free_on_both() -> int:
    while True:
        port = free_port()
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.2", port))
            return port
        except OSError:
            continue


class Proxy:
    """`rtvideo serve --triton-url …` as a process of its own."""

    def __init__(self, *urls: str) -> None:
        self.port = free_port()
        args = [a for url in urls for a in ("--triton-url", url)]
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "rtvideo.cli",
                "serve",
                "--port",
                str(self.port),
                "--model",
                MODEL,
                "--probe-interval",
                "1",
                "--log-level",
                "WARNING",
                *args,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert self.proc.stdout is not None and select.select([self.proc.stdout], [], [], 60)[0]
        assert self.proc.stdout.readline().startswith("rtvideo ready:")
        self.url = f"ws://127.0.0.1:{self.port}/v1/realtime/video"
        deadline = time.monotonic() + 30
        while not self.ready(len(urls)):
            assert time.monotonic() < deadline, "the proxy's endpoints did not come up"
            time.sleep(0.1)

    def ready(self, endpoints: int) -> bool:
        try:
            health = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=5).read())
        except OSError:
            return False
        up = [e for e in health["endpoints"] if e["state"] == "up" and e["capacity"]]
        return len(up) == endpoints

    def refusals(self) -> float:
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5).read().decode()
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("rtvideo_proxy_endpoint_refusals_total{")
        )

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)


async def start_latency(url: str) -> float:
    """connect → session.start → video.start, in seconds; the session is then stopped."""
    t0 = time.perf_counter()
    async with connect(url, max_size=None) as conn:
        await conn.send(json.dumps({"type": "session.start", "prompt": "a harbour at dawn"}))
        first = json.loads(await conn.recv())
        elapsed = time.perf_counter() - t0
        assert first["type"] == "video.start", first
        await conn.send(json.dumps({"type": "session.stop"}))
        while True:
            frame = await conn.recv()
            if isinstance(frame, str) and json.loads(frame)["type"] == "session.done":
                break
    return elapsed


def figures(label: str, values: list[float]) -> str:
    ms = [v * 1000 for v in values]
    if not ms:
        return f"{label:<44} (no samples)"
    return (
        f"{label:<44} n={len(ms):<3} p50 {percentile(ms, 0.5):6.1f} ms  p90 {percentile(ms, 0.9):6.1f} ms  "
        f"mean {statistics.fmean(ms):6.1f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=30, help="sessions per figure")
    ns = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, triton_key() as key:
        repo = Path(tmp) / "repo"
        derive_model(repo, MODEL, {"max_sessions": "2"})
        port = _free_on_both()
        servers = [
            TritonServer(
                TritonConfig(repo, grpc_port=port, http_port=free_port(), metrics_port=free_port(), host=host, key=key),
                stdout=Path(tmp) / f"triton-{host}.log",
            )
            for host in ("127.0.0.1", "127.0.0.2")
        ]
        t0 = time.monotonic()
        try:
            for server in servers:
                server.spawn()  # both at once
            for server in servers:
                server.wait_ready(300)
            print(f"two tritonservers ready in {time.monotonic() - t0:.1f} s")
            a, b = (s.grpc_url for s in servers)
            results: dict[str, list[float]] = {}
            for label, urls in (("one endpoint", (a,)), ("two endpoints", (a, b))):
                proxy = Proxy(*urls)
                try:
                    asyncio.run(start_latency(proxy.url))  # warm-up
                    results[label] = [asyncio.run(start_latency(proxy.url)) for _ in range(ns.samples)]
                finally:
                    proxy.close()

            direct = [TritonStreamSession(a, MODEL) for _ in range(2)]  # A full, unknown to the proxy
            proxy = Proxy(a, b)
            try:
                for d in direct:
                    d.start("someone else's session")
                    assert (d.next().message or {}).get("type") == "video.start"
                retried: list[float] = []
                first_choice_free: list[float] = []
                while len(retried) < ns.samples and len(retried) + len(first_choice_free) < 4 * ns.samples:
                    time.sleep(REFUSED_HOLD_SECONDS + 0.1)  # A is a first choice again
                    before = proxy.refusals()
                    latency = asyncio.run(start_latency(proxy.url))
                    (retried if proxy.refusals() > before else first_choice_free).append(latency)
            finally:
                proxy.close()
                for d in direct:
                    d.stop()
                    d.close()
        finally:
            for server in servers:
                server.stop()

    print(figures("start latency, one endpoint", results["one endpoint"]))
    print(figures("start latency, two endpoints", results["two endpoints"]))
    print(figures("A full: placed on B at once", first_choice_free))
    print(figures("A full: refused on A, replayed on B", retried))
    if retried and first_choice_free:
        cost = statistics.median(retried) - statistics.median(first_choice_free)
        print(f"cost of a retried placement (p50 difference): {cost * 1000:.1f} ms")


if __name__ == "__main__":
    main()
