"""Backend figures over direct gRPC: time to first chunk and interaction ack latency under load.

Starts its own tritonserver (rtvideo.triton) with models derived from the shipped one:
`paced` (the shipped real-time pacing) and `unpaced` (generation as fast as the CPU
allows, the worst case for ack latency). Prints figures; asserts nothing.

    .venv/bin/python benchmarks/bench_backend.py [--samples 40]
"""

from __future__ import annotations

import argparse
import queue
import statistics
import threading
import time

from bench_common import PACED_PARAMS, UNPACED_PARAMS, bench_triton, percentile

from rtvideo.client.triton_stream import TritonStreamSession


def first_chunk_seconds(url: str, model: str, runs: int) -> list[float]:
    out = []
    for i in range(runs):
        with TritonStreamSession(url, model) as s:
            t0 = time.perf_counter()
            s.start(f"first chunk probe {i}", num_frames=9, seed=i)
            for reply in s.until("session.done"):
                if reply.message and reply.message["type"] == "video.chunk_metadata":
                    out.append(reply.received - t0)
                    break
            list(s.until("session.done"))
    return out


def ack_latencies(
    url: str, model: str, sessions: int, samples: int, interval: float, warmup: float = 1.0
) -> list[float]:
    """`sessions` streams at once; each sends `samples` interactions (each a new prompt) and times every ack."""
    results: list[float] = []
    lock = threading.Lock()
    started = threading.Barrier(sessions)

    def one(index: int) -> None:
        with TritonStreamSession(url, model) as s:
            s.start(f"load session {index}", seed=index)
            assert (s.next().message or {}).get("type") == "video.start"
            started.wait()  # measure while every session streams, not while they start
            time.sleep(warmup)
            pending: dict[str, float] = {}
            mine: list[float] = []
            for k in range(samples):
                tag = s.interact(f"prompt {index}-{k}", event_id=f"e{k}", transition_chunks=2)
                pending[tag] = s.sent_at[tag]
                deadline = time.monotonic() + interval
                while time.monotonic() < deadline or pending:
                    try:
                        reply = s.next(timeout=max(0.001, deadline - time.monotonic()))
                    except queue.Empty:  # the interval is over
                        if not pending:
                            break
                        continue
                    if reply.tag in pending:
                        mine.append(reply.received - pending.pop(reply.tag))
            s.stop()
            list(s.until("session.done"))
        with lock:
            results.extend(mine)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(sessions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=40, help="interactions per session")
    parser.add_argument("--interval", type=float, default=0.1, help="seconds between interactions")
    args = parser.parse_args()
    with bench_triton({"paced": PACED_PARAMS, "unpaced": UNPACED_PARAMS}) as server:
        print(f"tritonserver ready in {server.startup_seconds:.1f} s")
        ttfc = first_chunk_seconds(server.grpc_url, "unpaced", 5)
        print(
            f"time to first chunk (256x256, 9 frames): median {statistics.median(ttfc) * 1e3:.1f} ms, "
            f"max {max(ttfc) * 1e3:.1f} ms over {len(ttfc)} sessions"
        )
        print(f"{'model':<9} {'sessions':>8} {'acks':>5} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
        for model in ("paced", "unpaced"):
            for sessions in (1, 4, 8):
                lat = ack_latencies(server.grpc_url, model, sessions, args.samples, args.interval)
                print(
                    f"{model:<9} {sessions:>8} {len(lat):>5} {percentile(lat, 0.5) * 1e3:>8.2f} "
                    f"{percentile(lat, 0.99) * 1e3:>8.2f} {max(lat) * 1e3:>8.2f}"
                )


if __name__ == "__main__":
    main()
