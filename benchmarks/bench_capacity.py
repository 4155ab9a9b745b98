"""Capacity: how many paced sessions one machine plays without a stall, and what the ack path
costs meanwhile, over WebSocket (through `rtvideo serve --triton-url`) and direct gRPC in the
same run. Prints figures; asserts nothing.

    .venv/bin/python benchmarks/bench_capacity.py [--counts 1,4,8,16,24,32] [--seconds 20]

For each session count N, N paced sessions stream at 256×256 (half through the proxy, half
direct), each sending a new prompt every `--update-interval` seconds. Per count it prints:
- stalls: media chunks that arrived late for a player holding one chunk of buffer (chunk k
  must arrive before first chunk + (k + 1) × chunk duration), and the worst lag;
- ack p50/p99 per path (send → `session.interaction.queued`);
- update visible p50/p99 (send → first chunk metadata listing the event in started_event_ids);
- CPU seconds per session-second (tritonserver, its stubs, render workers, the proxy).
A second table repeats the ack figures at 8 sessions with 4 new prompts a second each. Every
configuration in `--workers` (the model's `render_workers`) is measured in the same run, so
the ratios compare like with like. The last line gives the largest zero-stall count.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench_common import bench_triton, family, percentile
from bench_proxy import ProxyProcess
from websockets.asyncio.client import connect

from rtvideo.client.triton_stream import TritonStreamSession

CHUNK_SECONDS = 9 / 16


@dataclass
class Stats:
    acks: dict[str, list[float]] = field(default_factory=lambda: {"ws": [], "grpc": []})
    visible: list[float] = field(default_factory=list)
    late_chunks: int = 0
    chunks: int = 0
    worst_lag: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def chunk_times(self, arrivals: list[float]) -> None:
        """Stall accounting for one session's media chunk arrival times."""
        if not arrivals:
            return
        first = arrivals[0]
        with self.lock:
            for k, at in enumerate(arrivals):
                lag = at - (first + (k + 1) * CHUNK_SECONDS)
                self.chunks += 1
                if lag > 0:
                    self.late_chunks += 1
                    self.worst_lag = max(self.worst_lag, lag)


def cpu_seconds(pids: list[int]) -> float:
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])) / tick
        except (OSError, IndexError):
            pass
    return total


def direct_session(url: str, model: str, index: int, seconds: float, interval: float, stats: Stats,
                   barrier: threading.Barrier) -> None:
    arrivals: list[float] = []
    with TritonStreamSession(url, model) as s:
        s.start(f"capacity session {index}", seed=index)
        barrier.wait()
        t_end = time.perf_counter() + seconds
        next_send, k = time.perf_counter() + interval, 0
        sent: dict[str, float] = {}  # tag -> send time
        events: dict[str, float] = {}  # event id -> send time
        stopped = False
        while True:
            now = time.perf_counter()
            if not stopped and now >= t_end:
                s.stop()
                stopped = True
            elif not stopped and now >= next_send:
                tag = s.interact(f"scene {index} number {k}", event_id=f"e{k}", transition_chunks=2)
                sent[tag], events[f"e{k}"] = s.sent_at[tag], s.sent_at[tag]
                k, next_send = k + 1, next_send + interval
            try:
                reply = s.next(timeout=max(0.001, min(next_send, t_end) - time.perf_counter()) if not stopped else 30)
            except Exception:  # queue.Empty: time to send
                continue
            m = reply.message
            if m is None:
                continue
            if reply.tag in sent:
                with stats.lock:
                    stats.acks["grpc"].append(reply.received - sent.pop(reply.tag))
            if m["type"] == "video.chunk_metadata" and m["kind"] == "media":
                arrivals.append(reply.received)
                for event_id in m["started_event_ids"]:
                    with stats.lock:
                        stats.visible.append(reply.received - events.pop(event_id, reply.received))
            if m["type"] == "session.done":
                break
    stats.chunk_times(arrivals)


async def ws_session(url: str, index: int, seconds: float, interval: float, stats: Stats,
                     ready: asyncio.Event) -> None:
    arrivals: list[float] = []
    async with connect(url, max_size=None, compression=None) as ws:
        await ws.send(json.dumps({"type": "session.start", "prompt": f"capacity ws session {index}", "seed": index}))
        sent: dict[str, float] = {}

        async def sender() -> None:
            await ready.wait()
            t_end = time.perf_counter() + seconds
            k = 0
            while time.perf_counter() < t_end:
                await asyncio.sleep(interval)
                sent[f"e{k}"] = time.perf_counter()
                await ws.send(json.dumps({"type": "session.interaction", "interaction": {
                    "event_id": f"e{k}", "event": {"prompt": f"ws scene {index} number {k}"}, "transition_chunks": 2}}))
                k += 1
            await ws.send('{"type":"session.stop"}')

        task = asyncio.create_task(sender())
        events = dict[str, float]()
        async for frame in ws:
            now = time.perf_counter()
            if isinstance(frame, bytes):
                continue
            m = json.loads(frame)
            if m["type"] == "session.interaction.queued" and m["event_id"] in sent:
                events[m["event_id"]] = sent[m["event_id"]]
                with stats.lock:
                    stats.acks["ws"].append(now - sent.pop(m["event_id"]))
            elif m["type"] == "video.chunk_metadata" and m["kind"] == "media":
                arrivals.append(now)
                for event_id in m["started_event_ids"]:
                    if event_id in events:
                        with stats.lock:
                            stats.visible.append(now - events.pop(event_id))
            elif m["type"] == "session.done":
                break
        await task
    stats.chunk_times(arrivals)


def run_load(grpc_url: str, ws_url: str, model: str, sessions: int, seconds: float, interval: float,
             pids: list[int]) -> tuple[Stats, float]:
    stats = Stats()
    n_ws, n_grpc = sessions // 2, sessions - sessions // 2
    barrier = threading.Barrier(n_grpc + 1)
    ready = threading.Event()

    def ws_all() -> None:
        async def go() -> None:
            event = asyncio.Event()
            tasks = [asyncio.create_task(ws_session(ws_url, i, seconds, interval, stats, event)) for i in range(n_ws)]
            await asyncio.to_thread(ready.wait)
            event.set()
            await asyncio.gather(*tasks)
        asyncio.run(go())

    threads = [threading.Thread(target=direct_session, args=(grpc_url, model, i, seconds, interval, stats, barrier))
               for i in range(n_grpc)]
    ws_thread = threading.Thread(target=ws_all)
    for t in threads + [ws_thread]:
        t.start()
    barrier.wait()
    cpu0, t0 = cpu_seconds(pids), time.perf_counter()
    ready.set()
    for t in threads + [ws_thread]:
        t.join()
    cpu = cpu_seconds(pids) - cpu0
    return stats, cpu / (sessions * (time.perf_counter() - t0))


def ms(values: list[float], q: float) -> str:
    return f"{percentile(values, q) * 1e3:7.1f}" if values else "    n/a"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--counts", default="1,4,8,16,24,32")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--update-interval", type=float, default=1.0)
    parser.add_argument("--workers", default="0,2", help="render_workers values to compare (0: in the stub)")
    args = parser.parse_args()
    counts = [int(c) for c in args.counts.split(",")]
    configs = {f"paced_w{w}": {"max_sessions": str(max(*counts, 8) + 2), "render_workers": w}
               for w in args.workers.split(",")}
    with bench_triton(configs) as server:
        print(f"tritonserver ready in {server.startup_seconds:.1f} s; paced, 256x256, 9 frames a chunk at 16 fps; "
              f"{os.cpu_count()} cores")
        best: dict[str, int] = {}
        for model in configs:
            with ProxyProcess(server.grpc_url, model) as proxy:
                pids = family(server.pid) + [proxy.proc.pid]
                run_load(server.grpc_url, proxy.url, model, 4, 3, 0.5, pids)  # warm-up
                print(f"\n{model}: {args.update_interval:g} s between a session's prompt updates, {args.seconds:g} s each")
                print(f"{'N':>3} {'chunks':>6} {'late':>5} {'worst lag':>9} {'ack ws p50':>10} {'p99':>7} "
                      f"{'grpc p50':>8} {'p99':>7} {'visible p50':>11} {'p99':>7} {'cpu/sess-s':>10}")
                for n in counts:
                    s, cpu = run_load(server.grpc_url, proxy.url, model, n, args.seconds, args.update_interval, pids)
                    print(f"{n:>3} {s.chunks:>6} {s.late_chunks:>5} {s.worst_lag * 1e3:8.0f}m {ms(s.acks['ws'], .5):>10} "
                          f"{ms(s.acks['ws'], .99)} {ms(s.acks['grpc'], .5):>8} {ms(s.acks['grpc'], .99)} "
                          f"{ms(s.visible, .5):>11} {ms(s.visible, .99)} {cpu:10.3f}")
                    if s.late_chunks == 0:
                        best[model] = max(best.get(model, 0), n)
                s, _ = run_load(server.grpc_url, proxy.url, model, 8, args.seconds, 0.25, pids)
                print(f"  8 sessions × 4 new prompts/s: ack ws p50 {ms(s.acks['ws'], .5)} p99 {ms(s.acks['ws'], .99)} | "
                      f"grpc p50 {ms(s.acks['grpc'], .5)} p99 {ms(s.acks['grpc'], .99)} | "
                      f"ws p99 − grpc p99 {(percentile(s.acks['ws'], .99) - percentile(s.acks['grpc'], .99)) * 1e3:+.1f} ms | "
                      f"visible p99 {ms(s.visible, .99)} ms | late chunks {s.late_chunks}")
        print()
        for model, n in best.items():
            print(f"largest zero-stall session count: {model} {n}")


if __name__ == "__main__":
    main()
