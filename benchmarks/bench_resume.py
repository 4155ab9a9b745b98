"""What resume and watchers cost (docs/protocol.md §9): figures from one run, nothing asserted.

Starts its own tritonserver with the shipped pacing and one proxy process
(`python -m rtvideo.cli serve --triton-url …`), then measures:

- resume time: a resumable session's connection is aborted (no close frame) after a few
  chunks; a new connection sends `session.resume` naming the payload before the last one it
  read (so at least one pair is replayed); time from the new connection's open to its first
  replayed payload, p50/p99 over `--drops` drops (one per session);
- the owner's interaction ack latency p50/p99 with 0 and with 16 watchers (each reading
  everything), in the same run, alternating A-B-B-A, and the ratio of the two.

    .venv/bin/python benchmarks/bench_resume.py [--drops 20] [--acks 40]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import urllib.parse
from typing import Any

from bench_common import PACED_PARAMS, bench_triton, percentile
from bench_proxy import ProxyProcess
from websockets.asyncio.client import ClientConnection, connect

PACED = "realtime_video_paced"
OPEN: dict[str, Any] = {"max_size": None, "ping_interval": None}


async def _message(ws: ClientConnection) -> dict:
    """The next text message (payloads skipped)."""
    while isinstance(frame := await ws.recv(), bytes):
        pass
    return json.loads(frame)


async def _read_pair(ws: ClientConnection) -> dict:
    """The next chunk pair's metadata (its payload read too); other messages skipped."""
    while True:
        message = json.loads(await ws.recv())
        if message["type"] == "video.chunk_metadata":
            await ws.recv()
            return message


async def one_resume(url: str, seed: int) -> float:
    ws = await connect(url, **OPEN)
    await ws.send(json.dumps({"type": "session.start", "prompt": "a harbour", "seed": seed, "resumable": True}))
    start = json.loads(await ws.recv())
    last = -1
    for _ in range(3):
        last = (await _read_pair(ws))["transport_chunk_index"]
    last -= 1  # as if the last payload had not arrived whole: at least one pair is replayed
    ws.transport.abort()
    await asyncio.sleep(0.2)  # the proxy sees the drop (a real client's reconnect takes longer)
    t0 = time.perf_counter()
    again = await connect(url, **OPEN)
    await again.send(
        json.dumps(
            {"type": "session.resume", "resume_token": start["resume_token"], "last_transport_chunk_index": last}
        )
    )
    while True:
        message = json.loads(await again.recv())
        if message["type"] == "video.chunk_metadata" and message["kind"] != "init":
            await again.recv()
            seconds = time.perf_counter() - t0
            break
        if message["type"] == "video.chunk_metadata":
            await again.recv()  # the init pair
        elif message["type"] == "error":
            raise RuntimeError(message)
    await again.send(json.dumps({"type": "session.stop"}))
    while (await _message(again)).get("type") != "session.done":
        pass
    await again.close()
    return seconds


async def _watch(url: str, token: str, stop: asyncio.Event) -> int:
    """A watcher that reads everything until the session ends; returns the frames it read."""
    watch = url + "/watch?watch_token=" + urllib.parse.quote(token)
    frames = 0
    async with connect(watch, **OPEN) as ws:
        async for frame in ws:
            frames += 1
            if isinstance(frame, str) and json.loads(frame).get("type") == "session.done":
                break
    return frames


async def owner_acks(url: str, watchers: int, acks: int, seed: int) -> list[float]:
    """The owner's ack latencies (send → ack) with `watchers` watchers reading."""
    ws = await connect(url, **OPEN)
    await ws.send(json.dumps({"type": "session.start", "prompt": "a harbour", "seed": seed, "watchable": True}))
    start = json.loads(await ws.recv())
    stop = asyncio.Event()
    tasks = [asyncio.ensure_future(_watch(url, start["watch_token"], stop)) for _ in range(watchers)]
    await _read_pair(ws)
    latencies: list[float] = []
    pending: dict[str, float] = {}

    async def reader() -> None:
        while True:
            message = await _message(ws)
            if message["type"] == "session.interaction.queued" and message["event_id"] in pending:
                latencies.append(time.perf_counter() - pending.pop(message["event_id"]))
            elif message["type"] == "session.done":
                return

    reading = asyncio.ensure_future(reader())
    for i in range(acks):
        event_id = f"b{i}"
        pending[event_id] = time.perf_counter()
        interaction = {"event_id": event_id, "event": {"prompt": f"scene {i % 7}"}, "transition_chunks": 1}
        await ws.send(json.dumps({"type": "session.interaction", "interaction": interaction}))
        await asyncio.sleep(0.1)
    await ws.send(json.dumps({"type": "session.stop"}))
    await reading
    await ws.close()
    await asyncio.gather(*tasks, return_exceptions=True)
    return latencies


def ms(values: list[float], q: float) -> str:
    return f"{percentile(values, q) * 1e3:8.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--drops", type=int, default=20, help="sessions dropped and resumed")
    parser.add_argument("--acks", type=int, default=40, help="interactions per ack run")
    args = parser.parse_args()
    with bench_triton({PACED: PACED_PARAMS}) as server, ProxyProcess(server.grpc_url, PACED) as proxy:
        print(f"tritonserver ready in {server.startup_seconds:.1f} s (paced model, 256x256, 9 frames per chunk)")
        resumes = [asyncio.run(one_resume(proxy.url, seed)) for seed in range(args.drops)]
        print(f"\nresume time (ms): new connection → first replayed payload, {len(resumes)} drops")
        print(f"  p50 {ms(resumes, 0.5)}  p99 {ms(resumes, 0.99)}  max {max(resumes) * 1e3:8.2f}")

        asyncio.run(owner_acks(proxy.url, 0, 5, 99))  # warm-up
        runs: dict[int, list[float]] = {0: [], 16: []}
        for watchers in (0, 16, 16, 0):  # A-B-B-A
            runs[watchers] += asyncio.run(owner_acks(proxy.url, watchers, args.acks // 2, 100 + watchers))
        print("\nowner's ack latency (ms): send → ack, A-B-B-A")
        print(f"{'watchers':>8} {'acks':>5} {'p50':>8} {'p99':>8}")
        for watchers, values in runs.items():
            print(f"{watchers:>8} {len(values):>5} {ms(values, 0.5)} {ms(values, 0.99)}")
        print(f"  p99 ratio 16 / 0 watchers: {percentile(runs[16], 0.99) / percentile(runs[0], 0.99):.2f}")


if __name__ == "__main__":
    main()
