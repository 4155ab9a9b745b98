"""What a move between Tritons costs (docs/recordings.md "Moves"): figures from one run, nothing asserted.

Starts two tritonservers (the shipped pacing, `max_sessions` 8, 256x256) and one proxy in front
of both (`python -m rtvideo.cli serve --triton-url A,B`), plays `--sessions` live sessions that
read everything, then:

- drain: `POST /v1/endpoints/{A}/drain` moves A's sessions to B;
- loss: A is taken back, and B's tritonserver is killed (`kill -9` of its process group): every
  session moves to A.

For each, the longest wait between two media chunks of each session around the move, against
the longest wait of the same sessions before any move (the baseline, same run) and the chunk's
own duration; and the proxy's `rtvideo_proxy_session_move_seconds` (move to first chunk).

    .venv/bin/python benchmarks/bench_moves.py [--sessions 4]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import signal
import statistics
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench_common import PACED_PARAMS, triton_key
from bench_proxy import ProxyProcess
from websockets.asyncio.client import ClientConnection, connect

from rtvideo.triton.command import TritonConfig
from rtvideo.triton.model_repo import derive_model
from rtvideo.triton.server import TritonServer, free_port

MODEL = "realtime_video_moves"
CHUNK_SECONDS = 9 / 16


@contextlib.contextmanager
def two_tritons() -> Iterator[list[TritonServer]]:
    with tempfile.TemporaryDirectory() as tmp, triton_key() as key:
        repo = Path(tmp)
        derive_model(repo, MODEL, {**PACED_PARAMS, "max_sessions": "8"})
        servers = [
            TritonServer(
                TritonConfig(repo, grpc_port=free_port(), http_port=free_port(), metrics_port=free_port(), key=key),
                stdout=repo / f"triton-{i}.log",
            )
            for i in range(2)
        ]
        try:
            for server in servers:
                server.spawn()
            for server in servers:
                server.wait_ready(300)
            yield servers
        finally:
            for server in servers:
                server.stop()


class Player:
    """One session that reads everything, timing every media chunk's arrival."""

    def __init__(self, conn: ClientConnection) -> None:
        self.conn = conn
        self.arrivals: list[float] = []
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for frame in self.conn:
            if isinstance(frame, str):
                message = json.loads(frame)
                if message["type"] == "video.chunk_metadata" and message["kind"] == "media":
                    self.arrivals.append(time.monotonic())
                elif message["type"] in ("error", "session.done"):
                    raise RuntimeError(f"the session ended: {message}")

    def longest_wait(self, since: float, until: float) -> float:
        times = [t for t in self.arrivals if since <= t <= until]
        before = [t for t in self.arrivals if t < since][-1:]  # the last chunk before the window
        times = before + times
        return max((b - a for a, b in itertools.pairwise(times)), default=float("nan"))


def http(url: str, method: str = "GET") -> Any:
    request = urllib.request.Request(url, method=method)
    with urllib.request.urlopen(request, timeout=10) as reply:
        body = reply.read()
    return json.loads(body) if body.startswith((b"{", b"[")) else body.decode()


def move_seconds(base: str) -> dict[str, tuple[float, float]]:
    """reason → (moves, mean seconds) from the proxy's histogram."""
    out: dict[str, list[float]] = {}
    for line in http(f"{base}/metrics").splitlines():
        for suffix, slot in (("_count", 0), ("_sum", 1)):
            if line.startswith(f"rtvideo_proxy_session_move_seconds{suffix}{{"):
                reason = line.split('reason="')[1].split('"')[0]
                out.setdefault(reason, [0.0, 0.0])[slot] = float(line.rsplit(" ", 1)[1])
    return {r: (c, s / c if c else float("nan")) for r, (c, s) in out.items()}


async def scenario(url: str, base: str, servers: list[TritonServer], sessions: int) -> None:
    endpoints = [s.grpc_url for s in servers]
    players = []
    for i in range(sessions):
        conn = await connect(url, max_size=None, ping_interval=None, proxy=None)
        await conn.send(json.dumps({"type": "session.start", "prompt": f"a harbour, view {i}", "seed": i}))
        players.append(Player(conn))
    await asyncio.sleep(8 * CHUNK_SECONDS)
    t0 = time.monotonic()
    await asyncio.sleep(8 * CHUNK_SECONDS)
    baseline = [p.longest_wait(t0, time.monotonic()) for p in players]

    status = await asyncio.to_thread(http, f"{base}/healthz")
    busiest = max(status["endpoints"], key=lambda e: e["sessions"])["endpoint"]
    other = next(e for e in endpoints if e != busiest)
    t_drain = time.monotonic()
    await asyncio.to_thread(http, f"{base}/v1/endpoints/{busiest}/drain", "POST")
    await asyncio.sleep(8 * CHUNK_SECONDS)
    drain = [p.longest_wait(t_drain, time.monotonic()) for p in players]

    await asyncio.to_thread(http, f"{base}/v1/endpoints/{busiest}/drain", "DELETE")
    victim = next(s for s in servers if s.grpc_url == other)
    t_loss = time.monotonic()
    assert victim.pid is not None
    os.killpg(victim.pid, signal.SIGKILL)
    await asyncio.sleep(8 * CHUNK_SECONDS)
    loss = [p.longest_wait(t_loss, time.monotonic()) for p in players]

    print(f"\n{sessions} sessions, a chunk lasts {CHUNK_SECONDS:.3f} s; longest wait between two chunks (s):")
    print(f"{'window':<10} {'p50':>7} {'max':>7} {'ratio to baseline max':>22}")
    for label, values in (("baseline", baseline), ("drain", drain), ("loss", loss)):
        print(f"{label:<10} {statistics.median(values):7.3f} {max(values):7.3f} {max(values) / max(baseline):22.2f}")
    for reason, (count, mean) in sorted(move_seconds(base).items()):
        print(f"rtvideo_proxy_session_move_seconds{{reason={reason!r}}}: {count:.0f} moves, mean {mean:.3f} s")
    for p in players:
        p.task.cancel()
        await p.conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=4, help="live sessions")
    args = parser.parse_args()
    with two_tritons() as servers:
        urls = ",".join(s.grpc_url for s in servers)
        with ProxyProcess(urls, MODEL, ("--probe-interval", "0.5")) as proxy:
            base = proxy.url.split("/v1/")[0].replace("ws://", "http://", 1)
            print(f"two tritonservers and a proxy ready: {proxy.url}")
            asyncio.run(scenario(proxy.url, base, servers, args.sessions))


if __name__ == "__main__":
    main()
