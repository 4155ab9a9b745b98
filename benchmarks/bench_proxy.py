"""What the WebSocket proxy costs: the same sessions through `rtvideo.proxy` and over direct gRPC.

Starts its own tritonserver (rtvideo/triton + rtvideo/triton/model_repo.py) with the unpaced model (and
the shipped pacing, for ack latency under a realistic load), and one proxy process per
model (`python -m rtvideo.cli serve --triton-url …`, so the proxy has its own interpreter
as in production). Measures, in the same run:

- interaction ack latency p50/p99 while 1 or 8 sessions stream (send → ack received);
  each comparison runs the two paths in A-B-B-A order after a warm-up;
- time to first chunk (start sent → first media chunk received);
- bytes/s delivered while sessions stream unpaced.

Prints figures; asserts nothing.   .venv/bin/python benchmarks/bench_proxy.py [--samples 40]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import queue
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from bench_common import PACED_PARAMS, UNPACED_PARAMS, bench_triton, percentile
from websockets.asyncio.client import connect

from rtvideo.client.triton_stream import TritonStreamSession
from rtvideo.triton.server import free_port

UNPACED, PACED = "realtime_video", "realtime_video_paced"


@dataclass
class Run:
    """What one scenario measured over all its sessions."""

    acks: list[float] = field(default_factory=list)  # seconds, one per interaction
    first_chunk: list[float] = field(default_factory=list)  # seconds, one per session
    nbytes: int = 0
    seconds: float = 0.0  # wall time from the first start to the last session.done

    def merge(self, other: Run) -> None:
        self.acks += other.acks
        self.first_chunk += other.first_chunk
        self.nbytes += other.nbytes
        self.seconds += other.seconds


def abba(measure_direct: Callable[[], Run], measure_proxy: Callable[[], Run]) -> tuple[Run, Run]:
    """Both paths measured in A-B-B-A order, so that drift (warm-up, load) hits both alike."""
    d, p = Run(), Run()
    for path in (d, p, p, d):
        path.merge(measure_direct() if path is d else measure_proxy())
    return d, p


# --- direct gRPC (client/triton_stream.py), one thread per session -------------------------------
def direct_session(url: str, model: str, index: int, samples: int, interval: float, num_frames: int | None) -> Run:
    run = Run()
    with TritonStreamSession(url, model) as s:
        t0 = time.perf_counter()
        s.start(f"bench session {index}", seed=index, **({"num_frames": num_frames} if num_frames else {}))
        pending: dict[str, float] = {}
        next_send, sent = time.perf_counter(), 0
        while True:
            if sent < samples and time.perf_counter() >= next_send:
                tag = s.interact(f"prompt {index}-{sent % 5}", event_id=f"e{sent}", transition_chunks=2)
                pending[tag] = s.sent_at[tag]
                sent, next_send = sent + 1, next_send + interval
                if sent == samples and num_frames is None:
                    s.stop()
            try:
                reply = s.next(timeout=max(0.001, next_send - time.perf_counter()) if sent < samples else 30)
            except queue.Empty:  # time to send the next interaction
                continue
            run.nbytes += len(reply.data)
            if reply.tag in pending:
                run.acks.append(reply.received - pending.pop(reply.tag))
            kind = reply.message and reply.message["type"]
            if kind == "video.chunk_metadata" and not run.first_chunk:
                run.first_chunk.append(reply.received - t0)
            if kind == "session.done":
                return run


# --- through the proxy (websockets), one coroutine per session -----------------------------------
async def proxy_session(url: str, index: int, samples: int, interval: float, num_frames: int | None) -> Run:
    run = Run()
    async with connect(url, max_size=None, proxy=None, compression=None) as ws:
        t0 = time.perf_counter()
        start = {"type": "session.start", "prompt": f"bench session {index}", "seed": index}
        await ws.send(json.dumps({**start, **({"num_frames": num_frames} if num_frames else {})}))
        sent_at: dict[str, float] = {}

        async def send() -> None:
            for k in range(samples):
                sent_at[f"e{k}"] = time.perf_counter()
                await ws.send(
                    json.dumps(
                        {
                            "type": "session.interaction",
                            "interaction": {
                                "event_id": f"e{k}",
                                "event": {"prompt": f"prompt {index}-{k % 5}"},
                                "transition_chunks": 2,
                            },
                        }
                    )
                )
                await asyncio.sleep(max(0.0, t0 + (k + 1) * interval - time.perf_counter()))
            if num_frames is None:
                await ws.send(json.dumps({"type": "session.stop"}))

        sender = asyncio.create_task(send())
        async for frame in ws:
            now = time.perf_counter()
            if isinstance(frame, bytes):
                run.nbytes += len(frame)
                if not run.first_chunk:
                    run.first_chunk.append(now - t0)
                continue
            message = json.loads(frame)
            if message["type"] == "session.interaction.queued" and message["event_id"] in sent_at:
                run.acks.append(now - sent_at.pop(message["event_id"]))
            elif message["type"] == "session.done":
                break
        await sender
    return run


# --- scenarios -----------------------------------------------------------------------------------
def direct(url: str, model: str, sessions: int, samples: int, interval: float, num_frames: int | None = None) -> Run:
    total, lock = Run(), threading.Lock()

    def one(i: int) -> None:
        run = direct_session(url, model, i, samples, interval, num_frames)
        with lock:
            total.merge(run)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(sessions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    total.seconds = time.perf_counter() - t0
    return total


def proxied(url: str, sessions: int, samples: int, interval: float, num_frames: int | None = None) -> Run:
    async def all_sessions() -> list[Run]:
        return await asyncio.gather(*(proxy_session(url, i, samples, interval, num_frames) for i in range(sessions)))

    total = Run()
    t0 = time.perf_counter()
    for run in asyncio.run(all_sessions()):
        total.merge(run)
    total.seconds = time.perf_counter() - t0
    return total


@dataclass
class ProxyProcess:
    """`rtvideo serve --triton-url …` in its own interpreter; the ready line gives its URL."""

    triton_url: str
    model: str
    flags: tuple[str, ...] = ()  # more `rtvideo serve` flags
    proc: subprocess.Popen | None = None
    url: str = ""

    def __enter__(self) -> ProxyProcess:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "rtvideo.cli",
                "serve",
                "--triton-url",
                self.triton_url,
                "--model",
                self.model,
                "--port",
                str(free_port()),
                "--log-level",
                "WARNING",
                *self.flags,
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("rtvideo ready: "):
            raise RuntimeError(f"the proxy did not start: {line!r}")
        self.url = line.split()[2]
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.proc is not None
        self.proc.terminate()
        self.proc.wait(30)


def ms(values: list[float], q: float) -> str:
    return f"{percentile(values, q) * 1e3:8.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=60, help="interactions per session and path")
    parser.add_argument("--interval", type=float, default=0.05, help="seconds between a session's interactions")
    args = parser.parse_args()
    with (
        bench_triton({UNPACED: UNPACED_PARAMS, PACED: PACED_PARAMS}) as server,
        ProxyProcess(server.grpc_url, UNPACED) as fast,
        ProxyProcess(server.grpc_url, PACED) as paced,
    ):
        grpc = server.grpc_url
        print(f"tritonserver ready in {server.startup_seconds:.1f} s (256x256, 9 frames per chunk)")
        for model, proxy in ((UNPACED, fast), (PACED, paced)):  # warm-up: the generator speeds up
            direct(grpc, model, 8, 10, 0.02)
            proxied(proxy.url, 8, 10, 0.02)

        print("\ninteraction ack latency (ms): send → ack received, sessions streaming; runs in ABBA order")
        print(f"{'model':<8} {'sessions':>8} {'path':<7} {'acks':>5} {'p50':>8} {'p99':>8} {'max':>8}")
        for label, model, proxy in (("unpaced", UNPACED, fast), ("paced", PACED, paced)):
            for sessions in (1, 8):
                d, p = abba(
                    partial(direct, grpc, model, sessions, args.samples // 2, args.interval),
                    partial(proxied, proxy.url, sessions, args.samples // 2, args.interval),
                )
                for path, run in (("direct", d), ("proxy", p)):
                    print(
                        f"{label:<8} {sessions:>8} {path:<7} {len(run.acks):>5} {ms(run.acks, 0.5)} "
                        f"{ms(run.acks, 0.99)} {max(run.acks) * 1e3:8.2f}"
                    )
                print(
                    f"{'':<8} {'':>8} {'added':<7} {'':>5} "
                    f"{(percentile(p.acks, 0.5) - percentile(d.acks, 0.5)) * 1e3:8.2f} "
                    f"{(percentile(p.acks, 0.99) - percentile(d.acks, 0.99)) * 1e3:8.2f}"
                )

        runs, d_first, p_first = 10, Run(), Run()
        for _ in range(runs):  # alternating one-chunk sessions
            d_first.merge(direct(grpc, UNPACED, 1, 0, 0.0, num_frames=9))
            p_first.merge(proxied(fast.url, 1, 0, 0.0, num_frames=9))
        d_ttfc, p_ttfc = statistics.median(d_first.first_chunk), statistics.median(p_first.first_chunk)
        print(
            f"\ntime to first chunk (ms, median of {runs}): direct {d_ttfc * 1e3:.1f}, "
            f"proxy {p_ttfc * 1e3:.1f}, ratio {p_ttfc / d_ttfc:.2f}"
        )

        print("\nbytes/s delivered, unpaced, 540 frames per session, ABBA")
        print(f"{'sessions':>8} {'direct MB/s':>12} {'proxy MB/s':>12} {'ratio':>6}")
        for sessions in (1, 8):
            d, p = abba(
                partial(direct, grpc, UNPACED, sessions, 0, 0.0, num_frames=540),
                partial(proxied, fast.url, sessions, 0, 0.0, num_frames=540),
            )
            d_rate, p_rate = d.nbytes / d.seconds, p.nbytes / p.seconds
            print(f"{sessions:>8} {d_rate / 1e6:12.2f} {p_rate / 1e6:12.2f} {p_rate / d_rate:6.2f}")


if __name__ == "__main__":
    main()
