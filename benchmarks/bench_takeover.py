"""What a proxy restart costs its live sessions (docs/benchmarks.md "Takeovers"): figures from one
run; nothing asserted but sessions lost, which must be 0 (reported loudly, exit status 1).

Starts one tritonserver (the shipped pacing, `max_sessions` 8, 256x256), a redis-server, two
proxy processes sharing it as their session store (`RTVIDEO_SESSION_STORE`) behind a TCP load
balancer, and two more proxies, each with the in-process store, behind a balancer of their own
(the same shape without the shared store; tests/support/replicas.py, tcp_relay.py). Sessions
are the real Python client (`rtvideo.client`) through a balancer, each reading everything and
sending an interaction every `--interval` s. In order:

1. in-process store: `--sessions` sessions, their acks timed for `--window` s, then stopped;
2. Redis store: `--sessions` sessions, acks and gaps timed for `--window` s (the baseline); a
   rolling restart (SIGTERM replica 0, start it again, SIGTERM replica 1, start it again: each
   SIGTERM hands its sessions off with close 1012, the clients resume through the balancer at
   the other replica); a kill -9 of the replica that then holds the most sessions (its clients
   resume once its leases ran out); acks timed for `--window` s again; the sessions stopped;
3. in-process store again (A-B-A: the machine's drift shows as a difference of 1 and 3).

Printed: sessions lost (a session-ending error, or no `session.done` after the client's stop),
streams that repeated or skipped an index or changed request id; for each event, how the
replica's process ended, the longest wait between two media chunks a viewer saw around it
against the baseline's longest and the chunk's duration, and the client's takeover time (the
signal to its next media chunk; the close 1012 or the drop follows the signal at once)
p50/p99; the replicas' `rtvideo_proxy_takeover_seconds` by reason and `rtvideo_proxy_store_seconds`
for writes and lease takes (bucket bounds, every run of each replica); the ack latency (interaction sent → its ack) p50/p99 per window, interactions
sent and acked, and the p99 ratio of the Redis store to the in-process one.

    .venv/bin/python benchmarks/bench_takeover.py [--sessions 8] [--window 15] [--interval 1] [--logs DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from bench_common import PACED_PARAMS, bench_triton, percentile

from rtvideo.client.errors import RealtimeVideoError
from rtvideo.client.session import RealtimeVideoClient

# The replicas harness the end-to-end tests use lives with them, in tests/support.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.support.redis_server import serve_redis
from tests.support.replicas import Replicas

MODEL = "realtime_video_takeover"
CHUNK_SECONDS = 9 / 16
FRAMES = 100_000  # longer than the run: each session is stopped by its client
SETTLE_SECONDS = 30.0  # at most, for every session to have a media chunk after an event
#: the timed windows of the interactions' acks
OWN_1, OWN_3 = "in-process (1)", "in-process (3)"
REDIS, REDIS_AFTER = "Redis (2)", "Redis (2), after the takeovers"


class Viewer:
    """One live session with the real client: every chunk's arrival, and each interaction's
    ack latency by the phase it was sent in (an interaction still waiting at the stop counts as
    sent, never acked)."""

    def __init__(self, url: str, seed: int) -> None:
        self.seed = seed
        self.client = RealtimeVideoClient(url)
        self.request_id = ""
        self.arrivals: list[tuple[float, dict[str, Any]]] = []  # (when, metadata): media chunks, the trailer
        self.sent: Counter[str] = Counter()  # phase → interactions sent
        self.acks: dict[str, list[float]] = {}  # phase → seconds from the send to the ack
        self.phase = "warm-up"  # set by the scenario: where the next interaction counts
        self._tasks: list[asyncio.Task] = []

    async def open(self, interval: float) -> None:
        await self.client.__aenter__()
        start = await self.client.start(f"a harbour at dawn, view {self.seed}", num_frames=FRAMES, seed=self.seed)
        self.request_id = start["request_id"]
        self._tasks = [asyncio.create_task(self._read()), asyncio.create_task(self._interact(interval))]

    async def _read(self) -> None:
        async for chunk in self.client.chunks():
            self.arrivals.append((time.monotonic(), chunk.metadata))

    async def _interact(self, interval: float) -> None:
        await asyncio.sleep(interval * (self.seed % 8) / 8)  # the sessions' interactions spread out
        for n in itertools.count():
            phase, sent = self.phase, time.monotonic()
            self.sent[phase] += 1
            try:
                await self.client.interact(f"a harbour, change {n}", transition_chunks=1)
            except asyncio.TimeoutError:
                pass  # no ack for three sends, 5 s each: counted as sent, never acked
            except RealtimeVideoError:
                return  # the session ended
            else:
                self.acks.setdefault(phase, []).append(time.monotonic() - sent)
            await asyncio.sleep(max(0.0, interval - (time.monotonic() - sent)))

    async def stop(self) -> None:
        """Stop the session and read to its end (`session.done`), 60 s at most."""
        self._tasks[1].cancel()
        with contextlib.suppress(RealtimeVideoError, ConnectionError):
            await self.client.stop()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._tasks[0]), 60)
        await self.client.__aexit__(None, None, None)
        await asyncio.gather(*self._tasks, return_exceptions=True)

    @property
    def failed(self) -> bool:
        return self.client.failure is not None

    @property
    def lost(self) -> bool:
        """After its stop: a session-ending error, or no session.done."""
        return self.failed or self.client.done is None

    @property
    def broken(self) -> bool:
        """Its stream repeated or skipped an index, or changed request id."""
        indices = [m["transport_chunk_index"] for _, m in self.arrivals]
        if not indices or {m["request_id"] for _, m in self.arrivals} != {self.request_id}:
            return True
        return indices != list(range(indices[0], indices[0] + len(indices)))

    def media(self, since: float, until: float = float("inf")) -> list[float]:
        """Media chunk arrival times in [since, until], after the last one before `since`."""
        times = [t for t, m in self.arrivals if m["kind"] == "media"]
        return [t for t in times if t < since][-1:] + [t for t in times if since <= t <= until]

    def longest_wait(self, since: float, until: float) -> float:
        return max((b - a for a, b in itertools.pairwise(self.media(since, until))), default=float("nan"))

    def next_media(self, after: float) -> float | None:
        return next((t for t, m in self.arrivals if m["kind"] == "media" and t > after), None)


async def open_viewers(url: str, count: int, interval: float, first_seed: int) -> list[Viewer]:
    viewers = [Viewer(url, first_seed + i) for i in range(count)]
    for viewer in viewers:  # one after the other: a start is the proxy's and the model's busiest moment
        await viewer.open(interval)
    return viewers


async def settle(viewers: list[Viewer], since: float) -> float:
    """Until every viewer has a media chunk after `since` (SETTLE_SECONDS at most), then one chunk
    more; the seconds from `since`."""
    deadline = time.monotonic() + SETTLE_SECONDS
    while time.monotonic() < deadline and not all(v.next_media(since) or v.failed for v in viewers):
        await asyncio.sleep(0.1)
    await asyncio.sleep(CHUNK_SECONDS)
    return time.monotonic() - since


async def window(viewers: list[Viewer], phase: str, seconds: float) -> None:
    """`seconds` during which the viewers' interactions count for `phase`."""
    for viewer in viewers:
        viewer.phase = phase
    await asyncio.sleep(seconds)
    for viewer in viewers:
        viewer.phase = "between"


@dataclass
class Event:
    """A replica's end: when its signal went, how its process ended, and what the viewers saw."""

    label: str
    at: float
    resumes: list[int]  # each viewer's resumes before it
    ended: str = ""
    waits: list[float] = field(default_factory=list)  # each viewer's longest wait around it
    takeovers: list[float] = field(default_factory=list)  # signal → next media chunk, viewers that resumed

    def seen(self, viewers: list[Viewer], until: float) -> None:
        self.waits = [v.longest_wait(self.at, until) for v in viewers]
        for viewer, before in zip(viewers, self.resumes, strict=True):
            if viewer.client.resumes > before and (first := viewer.next_media(self.at)) is not None:
                self.takeovers.append(first - self.at)


async def end_replica(replicas: Replicas, index: int, viewers: list[Viewer], kill: bool) -> Event:
    event = Event(f"{'kill -9' if kill else 'SIGTERM'} {index}", time.monotonic(), [v.client.resumes for v in viewers])
    if kill:
        await asyncio.to_thread(replicas.kill9, index)
        event.ended = "killed"
    else:
        ended = await asyncio.to_thread(replicas.sigterm, index)
        event.ended = f"exit {ended.code} in {ended.seconds:.2f} s"
    return event


async def shared_store(replicas: Replicas, args: argparse.Namespace) -> tuple[list[Viewer], list[Event], float]:
    """Phase 2: the viewers, the events, and the baseline's longest wait."""
    viewers = await open_viewers(replicas.url, args.sessions, args.interval, 100)
    await asyncio.sleep(4 * CHUNK_SECONDS)
    t0 = time.monotonic()
    await window(viewers, REDIS, args.window)
    baseline = max(v.longest_wait(t0, time.monotonic()) for v in viewers)
    events = []
    for index in range(len(replicas)):  # the rolling restart
        event = await end_replica(replicas, index, viewers, kill=False)
        await asyncio.to_thread(replicas.restart, index)
        event.seen(viewers, event.at + await settle(viewers, event.at))
        events.append(event)
    holder = max(range(len(replicas)), key=lambda i: replicas[i].sessions_active())
    event = await end_replica(replicas, holder, viewers, kill=True)
    event.seen(viewers, event.at + await settle(viewers, event.at))
    events.append(event)
    await window(viewers, REDIS_AFTER, args.window)
    await asyncio.gather(*(v.stop() for v in viewers))
    return viewers, events, baseline


async def own_store(replicas: Replicas, args: argparse.Namespace, phase: str) -> list[Viewer]:
    """Phases 1 and 3: the in-process store's acks under the same load."""
    viewers = await open_viewers(replicas.url, args.sessions, args.interval, 200)
    await asyncio.sleep(4 * CHUNK_SECONDS)
    await window(viewers, phase, args.window)
    await asyncio.gather(*(v.stop() for v in viewers))
    return viewers


def histogram(replicas: Replicas, name: str, label: str) -> dict[str, list[tuple[float, float]]]:
    """`label`'s value → cumulative (le, count) of the histogram `name`, every run of every
    replica added up (a restarted replica's metrics start again at zero)."""
    runs = [m for r in replicas.replicas for m in r.ended_metrics]
    runs += [r.metrics() for r in replicas.replicas if r.alive]
    buckets: dict[str, dict[float, float]] = {}
    for run in runs:
        for key, value in run.items():
            if key.startswith(f"{name}_bucket{{"):
                labels = dict(part.split("=", 1) for part in key[key.index("{") + 1 : -1].split(","))
                by, le = labels[label].strip('"'), float(labels["le"].strip('"'))
                buckets.setdefault(by, {}).setdefault(le, 0.0)
                buckets[by][le] += value
    return {by: sorted(b.items()) for by, b in buckets.items()}


def bucket_quantile(cumulative: list[tuple[float, float]], q: float) -> float:
    """The upper bound of the bucket that holds quantile `q`."""
    total = cumulative[-1][1]
    return next(le for le, count in cumulative if count >= q * total)


def ms(values: list[float], q: float) -> str:
    return f"{percentile(values, q) * 1e3:8.1f}" if values else f"{'-':>8}"


def report_sessions(shared: list[Viewer]) -> int:
    lost = [v for v in shared if v.lost]
    print(f"\n{len(shared)} sessions through the balancer; a chunk lasts {CHUNK_SECONDS:.3f} s")
    if lost:
        print(f"\n!!!!!!!! SESSIONS LOST: {len(lost)} of {len(shared)} !!!!!!!!")
        for v in lost:
            print(f"  seed {v.seed}: {v.client.failure or 'no session.done after its stop'}")
        print()
    else:
        print(f"sessions lost: 0 of {len(shared)}")
    print(f"sessions whose stream repeated or skipped an index, or changed request id: {sum(v.broken for v in shared)}")
    print(f"errors the clients were told: {sum(v.client.errors.qsize() for v in shared)}")
    return len(lost)


def report_events(events: list[Event], baseline: float) -> None:
    print("\nlongest wait between two media chunks (s), and the client's takeover (signal → next media chunk, s):")
    print(f"{'event':<11} {'the process':<20} {'wait p50':>8} {'wait max':>8} {'/ base':>7} {'resumed':>7} "
          f"{'take p50':>8} {'take p99':>8}")  # fmt: skip
    print(f"{'baseline':<11} {'':<20} {'':>8} {baseline:8.3f} {1.0:7.2f}")
    for e in events:
        p50, p99 = (percentile(e.takeovers, q) for q in (0.5, 0.99))
        print(
            f"{e.label:<11} {e.ended:<20} {statistics.median(e.waits):8.3f} {max(e.waits):8.3f} "
            f"{max(e.waits) / baseline:7.2f} {len(e.takeovers):>7} {p50:8.3f} {p99:8.3f}"
        )


def report_acks(viewers: list[Viewer]) -> None:
    sent: Counter[str] = Counter()
    acks: dict[str, list[float]] = {}
    for v in viewers:
        sent.update(v.sent)
        for phase, values in v.acks.items():
            acks.setdefault(phase, []).extend(values)
    print("\ninteraction ack latency (ms): sent → ack, every session streaming")
    print(f"{'store':<34} {'sent':>5} {'acked':>5} {'p50':>8} {'p99':>8} {'max':>8}")
    rows = [((OWN_1,), OWN_1), ((OWN_3,), OWN_3), ((OWN_1, OWN_3), "in-process, 1 and 3"), ((REDIS,), REDIS)]
    rows.append(((REDIS_AFTER,), REDIS_AFTER))
    for phases, label in rows:
        values = [x for p in phases for x in acks.get(p, [])]
        top = f"{max(values) * 1e3:8.1f}" if values else f"{'-':>8}"
        print(
            f"{label:<34} {sum(sent[p] for p in phases):>5} {len(values):>5} {ms(values, 0.5)} {ms(values, 0.99)} {top}"
        )
    own, redis = acks.get(OWN_1, []) + acks.get(OWN_3, []), acks.get(REDIS, [])
    if own and redis:
        print(f"ack p99, Redis / in-process: {percentile(redis, 0.99) / percentile(own, 0.99):.2f} "
              f"(p50: {percentile(redis, 0.5) / percentile(own, 0.5):.2f})")  # fmt: skip


def report_histograms(replicas: Replicas) -> None:
    print("\nthe Redis replicas' histograms (upper bounds of their buckets):")
    for name, label, only in (
        ("rtvideo_proxy_takeover_seconds", "reason", None),
        ("rtvideo_proxy_store_seconds", "call", ("write", "acquire")),
    ):
        for by, cumulative in sorted(histogram(replicas, name, label).items()):
            if cumulative and cumulative[-1][1] and (only is None or by in only):
                print(
                    f"  {name}{{{label}={by!r}}}: {cumulative[-1][1]:.0f}, "
                    f"p50 <= {bucket_quantile(cumulative, 0.5):g} s, p99 <= {bucket_quantile(cumulative, 0.99):g} s"
                )


def no_redis() -> NoReturn:
    raise SystemExit("redis-server is not installed (scripts/test.sh installs it: apt-get install -y redis-server)")


async def scenario(shared: Replicas, own: Replicas, args: argparse.Namespace) -> int:
    first = await own_store(own, args, OWN_1)
    viewers, events, baseline = await shared_store(shared, args)
    third = await own_store(own, args, OWN_3)
    lost = report_sessions(viewers)
    report_events(events, baseline)
    report_histograms(shared)
    report_acks(first + viewers + third)
    return 1 if lost else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=8, help="live sessions (the model takes 8)")
    parser.add_argument("--window", type=float, default=15.0, help="seconds of each timed window")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between a session's interactions")
    parser.add_argument("--logs", type=Path, help="keep the proxies' and redis' logs in this directory")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        logs = args.logs or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-takeover-")))
        for folder in ("shared", "memory"):
            (logs / folder).mkdir(parents=True, exist_ok=True)
        triton = stack.enter_context(bench_triton({MODEL: PACED_PARAMS}))
        redis = stack.enter_context(serve_redis(logs, no_redis))
        options: dict[str, Any] = {
            "model": MODEL,
            "triton_metrics_port": triton.config.metrics_port,
            # every viewer comes from 127.0.0.1: the share of one address is the whole model here
            "flags": ("--max-sessions-per-client", str(args.sessions)),
        }
        shared = stack.enter_context(Replicas(logs / "shared", triton.grpc_url, redis.url, count=2, **options))
        own = stack.enter_context(Replicas(logs / "memory", triton.grpc_url, "memory", count=2, **options))
        print(
            f"tritonserver ready in {triton.startup_seconds:.1f} s; two replicas sharing redis-server behind "
            f"{shared.url}; two with their own store behind {own.url}"
        )
        code = asyncio.run(scenario(shared, own, args))
    sys.exit(code)


if __name__ == "__main__":
    main()
