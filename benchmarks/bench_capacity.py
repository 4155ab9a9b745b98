"""Capacity: how many paced sessions one machine plays without a stall, and what the ack path
costs meanwhile, over WebSocket (through `rtvideo serve --triton-url`) and direct gRPC in the
same run. Prints figures; asserts nothing.

    .venv/bin/python benchmarks/bench_capacity.py [--counts 1,4,8,16,24,32,40] [--seconds 20]

For each session count N, N paced sessions stream at 256×256 (half through the proxy, half
direct), each sending a new prompt every `--update-interval` seconds. Per count it prints:
- stalls: media chunks that arrived late for a player holding one chunk of buffer (chunk k
  must arrive before first chunk + (k + 1) × chunk duration), and the worst lag;
- ack p50/p99 per path (send → `session.interaction.queued`);
- update visible p50/p99 (send → first chunk metadata listing the event in started_event_ids);
- CPU seconds per session-second (tritonserver, its stubs, render workers, the proxy; not the
  clients, which run in processes of their own: a few sessions each).
Then the ack figures at 8 sessions with 4 new prompts a second each (`--ack-seconds` long),
twice: with the sessions' updates staggered (independent clients, as everywhere else here) and
all sent at the same moment (`first_update`). Every configuration in `--workers` (the model's `render_workers`) is
measured in the same run, so the ratios compare like with like. The last line gives the
largest zero-stall count.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import queue
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from bench_common import bench_triton, family, percentile
from bench_proxy import ProxyProcess
from websockets.asyncio.client import connect

from rtvideo.client.triton_stream import TritonStreamSession

CHUNK_SECONDS = 9 / 16
WS_PER_PROCESS = 8  # WebSocket sessions per client process (one event loop)
GRPC_PER_PROCESS = 4  # direct gRPC sessions per client process (a thread each)


@dataclass
class Stats:
    """What one client process measured (plain lists: it crosses a process boundary)."""

    acks: dict[str, list[float]] = field(default_factory=lambda: {"ws": [], "grpc": []})
    visible: list[float] = field(default_factory=list)
    arrivals: list[list[float]] = field(default_factory=list)  # per session: media chunk arrival times

    def merge(self, other: Stats) -> None:
        for path, values in other.acks.items():
            self.acks[path] += values
        self.visible += other.visible
        self.arrivals += other.arrivals

    def stalls(self) -> tuple[int, int, float]:
        """(chunks, late chunks, worst lag): chunk k of a session must arrive before its first
        chunk + (k + 1) × chunk duration (a player holding one chunk of buffer)."""
        chunks = late = 0
        worst = 0.0
        for arrivals in self.arrivals:
            for k, at in enumerate(arrivals):
                lag = at - (arrivals[0] + (k + 1) * CHUNK_SECONDS)
                chunks += 1
                if lag > 0:
                    late += 1
                    worst = max(worst, lag)
        return chunks, late, worst


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


def sleep_until(at: float) -> None:
    time.sleep(max(0.0, at - time.monotonic()))


def first_update(index: int, interval: float, aligned: bool) -> float:
    """Seconds from the common start to session `index`'s first prompt update. Independent
    clients do not send in step: staggered by the golden-ratio sequence (evenly spread for
    any count), unless `aligned` (every session at once: the worst case for the ack path)."""
    return interval * (1.0 if aligned else 1.0 + (index * 0.6180339887) % 1.0)


def direct_session(
    url: str,
    model: str,
    index: int,
    begin: float,
    seconds: float,
    interval: float,
    aligned: bool,
    stats: Stats,
    lock: threading.Lock,
) -> None:
    arrivals: list[float] = []
    acks: list[float] = []
    visible: list[float] = []
    with TritonStreamSession(url, model) as s:
        s.start(f"capacity session {index}", seed=index)
        sleep_until(begin)
        t_end = time.perf_counter() + seconds
        next_send, k = time.perf_counter() + first_update(index, interval, aligned), 0
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
            except queue.Empty:  # time to send
                continue
            m = reply.message
            if m is None:
                continue
            if reply.tag in sent:
                acks.append(reply.received - sent.pop(reply.tag))
            if m["type"] == "video.chunk_metadata" and m["kind"] == "media":
                arrivals.append(reply.received)
                for event_id in m["started_event_ids"]:
                    visible.append(reply.received - events.pop(event_id, reply.received))
            if m["type"] == "session.done":
                break
    with lock:
        stats.acks["grpc"] += acks
        stats.visible += visible
        stats.arrivals.append(arrivals)


def direct_sessions(
    url: str, model: str, first: int, count: int, begin: float, seconds: float, interval: float, aligned: bool
) -> Stats:
    """`count` direct gRPC sessions, a thread each, in this (client) process."""
    stats, lock = Stats(), threading.Lock()
    threads = [
        threading.Thread(
            target=direct_session, args=(url, model, first + i, begin, seconds, interval, aligned, stats, lock)
        )
        for i in range(count)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return stats


async def ws_session(
    url: str, index: int, begin: float, seconds: float, interval: float, aligned: bool, stats: Stats
) -> None:
    arrivals: list[float] = []
    async with connect(url, max_size=None, compression=None) as ws:
        await ws.send(json.dumps({"type": "session.start", "prompt": f"capacity ws session {index}", "seed": index}))
        sent: dict[str, float] = {}

        async def sender() -> None:
            await asyncio.sleep(max(0.0, begin - time.monotonic()))
            t_end = time.perf_counter() + seconds
            next_send, k = time.perf_counter() + first_update(index, interval, aligned), 0
            while next_send < t_end:
                await asyncio.sleep(max(0.0, next_send - time.perf_counter()))
                next_send += interval
                sent[f"e{k}"] = time.perf_counter()
                await ws.send(
                    json.dumps(
                        {
                            "type": "session.interaction",
                            "interaction": {
                                "event_id": f"e{k}",
                                "event": {"prompt": f"ws scene {index} number {k}"},
                                "transition_chunks": 2,
                            },
                        }
                    )
                )
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
                stats.acks["ws"].append(now - sent.pop(m["event_id"]))
            elif m["type"] == "video.chunk_metadata" and m["kind"] == "media":
                arrivals.append(now)
                for event_id in m["started_event_ids"]:
                    if event_id in events:
                        stats.visible.append(now - events.pop(event_id))
            elif m["type"] == "session.done":
                break
        await task
    stats.arrivals.append(arrivals)


def ws_sessions(
    url: str, first: int, count: int, begin: float, seconds: float, interval: float, aligned: bool
) -> Stats:
    """`count` WebSocket sessions on one event loop, in this (client) process."""
    stats = Stats()

    async def go() -> None:
        await asyncio.gather(
            *(ws_session(url, first + i, begin, seconds, interval, aligned, stats) for i in range(count))
        )

    asyncio.run(go())
    return stats


def groups(count: int, size: int) -> list[tuple[int, int]]:
    """(first, count) of each client process's share of `count` sessions."""
    return [(first, min(size, count - first)) for first in range(0, count, size)]


def run_load(
    clients: ProcessPoolExecutor,
    grpc_url: str,
    ws_url: str,
    model: str,
    sessions: int,
    seconds: float,
    interval: float,
    pids: list[int],
    aligned: bool = False,
) -> tuple[Stats, float]:
    """Half the sessions over WebSocket, half direct, in client processes of their own (so the
    clients' own Python does not queue the measured replies behind each other). Everyone sends
    its first update at the same moment."""
    begin = time.monotonic() + 3.0 + sessions * 0.1  # after every session has started
    n_ws = sessions // 2
    jobs = [
        clients.submit(ws_sessions, ws_url, first, n, begin, seconds, interval, aligned)
        for first, n in groups(n_ws, WS_PER_PROCESS)
    ]
    jobs += [
        clients.submit(direct_sessions, grpc_url, model, n_ws + first, n, begin, seconds, interval, aligned)
        for first, n in groups(sessions - n_ws, GRPC_PER_PROCESS)
    ]
    sleep_until(begin)
    cpu0, t0 = cpu_seconds(pids), time.perf_counter()
    stats = Stats()
    for job in jobs:
        stats.merge(job.result())
    cpu = cpu_seconds(pids) - cpu0
    return stats, cpu / (sessions * (time.perf_counter() - t0))


def ms(values: list[float], q: float) -> str:
    return f"{percentile(values, q) * 1e3:7.1f}" if values else "    n/a"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--counts", default="1,4,8,16,24,32,40")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--update-interval", type=float, default=1.0)
    parser.add_argument(
        "--ack-seconds",
        type=float,
        default=60.0,
        help="length of each 8 × 4/s run: ~4 acks a second per session, so 60 s puts ~10 "
        "samples per path above the p99 (20 s puts only ~3 there: too few for a steady p99)",
    )
    parser.add_argument("--workers", default="0,2", help="render_workers values to compare (0: in the stub)")
    args = parser.parse_args()
    counts = [int(c) for c in args.counts.split(",")]
    configs = {
        f"paced_w{w}": {"max_sessions": str(max(*counts, 8) + 2), "render_workers": w} for w in args.workers.split(",")
    }
    biggest = max(*counts, 8)
    processes = len(groups(biggest // 2, WS_PER_PROCESS)) + len(groups(biggest - biggest // 2, GRPC_PER_PROCESS))
    with (
        bench_triton(configs) as server,
        ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn")) as clients,
    ):
        print(
            f"tritonserver ready in {server.startup_seconds:.1f} s; paced, 256x256, 9 frames a chunk at 16 fps; "
            f"{os.cpu_count()} cores"
        )
        best: dict[str, int] = {}
        for model in configs:
            # every WebSocket session comes from this one address, all connecting at once and each
            # starting at once: ten times the address's default part of the waiting share (4), which
            # admits them as the earlier ones start (rtvideo.proxy.edge.waiting)
            flags = ("--max-sessions-per-client", str(biggest))
            with ProxyProcess(server.grpc_url, model, flags) as proxy:
                assert server.pid is not None and proxy.proc is not None  # both started on entering
                pids = [*family(server.pid), proxy.proc.pid]
                run_load(
                    clients, server.grpc_url, proxy.url, model, biggest, 2, 0.5, pids
                )  # warm-up: every client process
                print(
                    f"\n{model}: {args.update_interval:g} s between a session's prompt updates, {args.seconds:g} s each"
                )
                print(
                    f"{'N':>3} {'chunks':>6} {'late':>5} {'worst lag':>9} {'ack ws p50':>10} {'p99':>7} "
                    f"{'grpc p50':>8} {'p99':>7} {'visible p50':>11} {'p99':>7} {'cpu/sess-s':>10}"
                )
                for n in counts:
                    s, cpu = run_load(
                        clients, server.grpc_url, proxy.url, model, n, args.seconds, args.update_interval, pids
                    )
                    chunks, late, worst = s.stalls()
                    print(
                        f"{n:>3} {chunks:>6} {late:>5} {worst * 1e3:8.0f}m {ms(s.acks['ws'], 0.5):>10} "
                        f"{ms(s.acks['ws'], 0.99)} {ms(s.acks['grpc'], 0.5):>8} {ms(s.acks['grpc'], 0.99)} "
                        f"{ms(s.visible, 0.5):>11} {ms(s.visible, 0.99)} {cpu:10.3f}"
                    )
                    if late == 0:
                        best[model] = max(best.get(model, 0), n)
                for aligned in (False, True):
                    s, _ = run_load(
                        clients, server.grpc_url, proxy.url, model, 8, args.ack_seconds, 0.25, pids, aligned
                    )
                    print(
                        f"  8 sessions × 4 new prompts/s, {'all at once' if aligned else 'staggered  '}: "
                        f"ack ws p50 {ms(s.acks['ws'], 0.5)} p99 {ms(s.acks['ws'], 0.99)} | "
                        f"grpc p50 {ms(s.acks['grpc'], 0.5)} p99 {ms(s.acks['grpc'], 0.99)} | "
                        f"ws p99 − grpc p99 {(percentile(s.acks['ws'], 0.99) - percentile(s.acks['grpc'], 0.99)) * 1e3:+.1f} ms | "
                        f"visible p99 {ms(s.visible, 0.99)} ms | late chunks {s.stalls()[1]}"
                    )
        print()
        for model, n in best.items():
            print(f"largest zero-stall session count: {model} {n}")


if __name__ == "__main__":
    main()
