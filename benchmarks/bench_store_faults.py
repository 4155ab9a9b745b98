"""The shared session store under a stall and under a padding client (docs/benchmarks.md "The
session store under faults"): figures from one run, on the local replicas recipe
(`rtvideo replicas`: one Triton, two proxies, redis-server, HAProxy; docs/operations.md "Trying
replicas locally"). Nothing is asserted but the session's life: a stall that ends it is
reported loudly (exit status 1).

1. **A store stall.** One session through HAProxy (a raw WebSocket client that reads every
   frame and resumes a dropped connection as `rtvideo.client` does) sends an interaction every
   1 / `--rate` s. Three windows of `--stall` s on the same session: the baseline; the stall
   (redis-server SIGSTOP at its start, SIGCONT at its end); after. Per window: interactions sent,
   acked, answered `store_unavailable` (retryable: counted apart from the acks), answered with
   another error, unanswered at the end; the ack latency (send → `session.interaction.queued`)
   p50/p99/max; the longest gap between two media chunks the viewer saw; the connection drops.
   Then the ratios of the stall's longest gap and ack p99 to the baseline's.
2. **Bytes per session.** A new session sends padded interactions (a `--pad`-byte top-level
   field the protocol ignores, and a prompt) at the proxy's message rate limit for `--minutes`
   minutes; every minute, the store's bytes (Redis `MEMORY USAGE` of every `rtvideo:` key; this
   session is the only one then) and the interactions acked and refused. After its stop, what is
   left of it in the store.
3. **One recordings eviction** at 10 and at 10,000 recordings (bench_recordings.py's
   `eviction_costs`, `--evictions` of each, no Triton), so the issue's figures come from one run.

    .venv/bin/python benchmarks/bench_store_faults.py [--minutes 10] [--stall 8] [--rate 4] [--logs DIR]
        [--evictions 50]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench_common import percentile
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from rtvideo.client.errors import RealtimeVideoError
from rtvideo.client.reconnect import Reconnect
from rtvideo.replicas import LocalReplicas

MODEL = "realtime_video"
SIZE = {"width": 256, "height": 256}
FRAMES = 1_000_000  # longer than the run: each session is stopped by its client
RATE_LIMIT = 20.0  # the proxy's --max-messages-per-second default (proxy/settings.py)
STORE_UNAVAILABLE = "store_unavailable"


@dataclass
class Window:
    """What one window of the session saw."""

    label: str
    began: float = 0.0
    ended: float = float("inf")
    sent: int = 0
    acks: list[float] = field(default_factory=list)
    acked_at: list[float] = field(default_factory=list)  # when each ack arrived (monotonic)
    store_unavailable: int = 0
    refusals: list[float] = field(default_factory=list)  # seconds from a send to its store_unavailable
    errors: Counter[str] = field(default_factory=Counter)
    drops: int = 0


class Session:
    """One session over a raw WebSocket: every media chunk's arrival, each interaction's answer
    (its ack's latency, or its error code), and a resume after each dropped connection."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.ws: ClientConnection | None = None
        self.link = Reconnect(url, None, 10.0, 8, 0.25)
        self.video_start: dict[str, Any] = {}
        self.resume_token = ""
        self.media: list[float] = []  # arrival times of media chunks
        self.sent: dict[str, tuple[float, Window]] = {}  # event id → (when sent, its window)
        self.answered: set[str] = set()
        self.errors: Counter[str] = Counter()  # every error frame, by code (session-level ones too)
        self.done: dict[str, Any] | None = None
        self.failure = ""
        self.drops = 0
        self.window = Window("warm-up")
        self._reader: asyncio.Task[None] | None = None
        self._started = asyncio.Event()

    async def open(self, seed: int) -> None:
        self.ws = await connect(self.url, max_size=2**26, open_timeout=10)
        start = {"type": "session.start", "prompt": f"a harbour at dawn, view {seed}", "seed": seed}
        await self.ws.send(json.dumps({**start, "num_frames": FRAMES, **SIZE}))
        self._reader = asyncio.ensure_future(self._read())
        await asyncio.wait_for(self._started.wait(), 120)
        if self.failure:
            raise RuntimeError(f"the session did not start: {self.failure}")

    async def interact(self, event_id: str, prompt: str, pad: int = 0) -> None:
        interaction = {"event_id": event_id, "event": {"prompt": prompt}, "transition_chunks": 1}
        message: dict[str, Any] = {"type": "session.interaction", "interaction": interaction}
        if pad:
            message["pad"] = "x" * pad  # a top-level field the protocol ignores
        self.sent[event_id] = (time.monotonic(), self.window)
        self.window.sent += 1
        with contextlib.suppress(ConnectionClosed):  # a drop: unanswered unless the resume brings it
            assert self.ws is not None
            await self.ws.send(json.dumps(message))

    async def stop(self) -> None:
        with contextlib.suppress(ConnectionClosed):
            assert self.ws is not None
            await self.ws.send(json.dumps({"type": "session.stop"}))
        with contextlib.suppress(asyncio.TimeoutError):
            assert self._reader is not None
            await asyncio.wait_for(asyncio.shield(self._reader), 60)
        self.link.closing = True
        if self.ws is not None:
            await self.ws.close()
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)

    def longest_gap(self, began: float, ended: float) -> float:
        before = [t for t in self.media if t < began][-1:]
        times = before + [t for t in self.media if began <= t <= ended]
        return max((b - a for a, b in itertools.pairwise(times)), default=float("nan"))

    async def _read(self) -> None:
        metadata: dict[str, Any] | None = None
        while True:
            assert self.ws is not None
            try:
                async for frame in self.ws:
                    if isinstance(frame, bytes):
                        if metadata is not None and self.link.fresh(metadata) and metadata.get("kind") == "media":
                            self.media.append(time.monotonic())
                        metadata = None
                        continue
                    message = json.loads(frame)
                    if message.get("type") == "video.chunk_metadata":
                        metadata = message
                    else:
                        self._dispatch(message)
            except ConnectionClosed:
                pass
            metadata = None
            if self.done is not None or self.failure or self.link.closing or not self.resume_token:
                self._started.set()
                return
            self.drops += 1
            self.window.drops += 1
            resumed = await self.link.resume(self.resume_token)
            if isinstance(resumed, RealtimeVideoError):
                self.failure = f"{resumed.code}: {resumed.message}"
                return
            self.ws, self.resume_token = resumed

    def _dispatch(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == "video.start":
            self.video_start, self.resume_token = message, message.get("resume_token", "")
            self._started.set()
        elif kind == "session.interaction.queued":
            self._answer(message.get("event_id"), None)
        elif kind == "error":
            code = str(message.get("code"))
            self.errors[code] += 1
            if message.get("event_id") in self.sent:
                self._answer(message["event_id"], code)
            elif not self.video_start:
                self.failure = f"{code}: {message.get('message')}"
                self._started.set()
        elif kind == "session.done":
            self.done = message

    def _answer(self, event_id: Any, code: str | None) -> None:
        if event_id not in self.sent or event_id in self.answered:
            return  # a repeated ack (after a resume) counts once
        self.answered.add(event_id)
        sent, window = self.sent[event_id]
        if code is None:
            window.acks.append(time.monotonic() - sent)
            window.acked_at.append(time.monotonic())
        elif code == STORE_UNAVAILABLE:
            window.store_unavailable += 1
            window.refusals.append(time.monotonic() - sent)
        else:
            window.errors[code] += 1

    def unanswered(self, window: Window) -> int:
        return sum(1 for eid, (_, w) in self.sent.items() if w is window and eid not in self.answered)


async def steady(session: Session, window: Window, seconds: float, rate: float, prefix: str) -> None:
    """Interactions every 1 / `rate` s for `seconds`, counted in `window`."""
    session.window = window
    window.began = time.monotonic()
    for n in itertools.count():
        due = window.began + n / rate
        if due >= window.began + seconds:
            break
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        await session.interact(f"{prefix}-{n}", f"a harbour, change {n}")
    await asyncio.sleep(max(0.0, window.began + seconds - time.monotonic()))
    window.ended = time.monotonic()


def ms(values: list[float], q: float) -> str:
    return f"{percentile(values, q) * 1e3:9.1f}" if values else f"{'-':>9}"


async def stall(run: LocalReplicas, args: argparse.Namespace) -> int:
    session = Session(run.url)
    await session.open(seed=11)
    while len(session.media) < 4:  # warm: the stream is steady
        await asyncio.sleep(0.1)
    redis_pid = run.parts["redis"].pid
    assert redis_pid is not None
    windows = [Window("baseline"), Window(f"store stalled {args.stall:g} s"), Window("after the stall")]
    await steady(session, windows[0], args.stall, args.rate, "base")
    os.kill(redis_pid, signal.SIGSTOP)
    try:
        await steady(session, windows[1], args.stall, args.rate, "stall")
    finally:
        os.kill(redis_pid, signal.SIGCONT)
    await steady(session, windows[2], args.stall, args.rate, "after")
    await asyncio.sleep(5)  # late answers
    lived = not session.failure and session.done is None
    await session.stop()
    print(f"\n1. a store stall: redis-server SIGSTOP for {args.stall:g} s, one session sending {args.rate:g}/s")
    print(
        f"{'window':<22} {'sent':>5} {'acked':>5} {'unavail':>7} {'other':>5} {'none':>5} "
        f"{'ack p50':>9} {'ack p99':>9} {'ack max':>9} {'answer p99':>10} {'gap max':>8} {'drops':>5}"
    )
    for w in windows:
        top = f"{max(w.acks) * 1e3:9.1f}" if w.acks else f"{'-':>9}"
        print(
            f"{w.label:<22} {w.sent:>5} {len(w.acks):>5} {w.store_unavailable:>7} {sum(w.errors.values()):>5} "
            f"{session.unanswered(w):>5} {ms(w.acks, 0.5)} {ms(w.acks, 0.99)} {top} "
            f"{ms(w.acks + w.refusals, 0.99):>10} {session.longest_gap(w.began, w.ended):8.3f} {w.drops:>5}"
        )
    print(
        "(ms; unavail: answered store_unavailable; answer: the send to its ack or its store_unavailable; "
        "gap: the longest wait between two media chunks, s)"
    )
    base, stalled = windows[0], windows[1]
    gap_ratio = session.longest_gap(stalled.began, stalled.ended) / session.longest_gap(base.began, base.ended)
    print(f"stall / baseline: longest gap {gap_ratio:.2f}", end="")
    if base.acks and stalled.acks:
        print(f", ack p99 {percentile(stalled.acks, 0.99) / percentile(base.acks, 0.99):.2f}", end="")
    else:
        print(", ack p99 - (no ack during the stall)", end="")
    answers = stalled.acks + stalled.refusals
    if base.acks and answers:
        print(f", answer p99 {percentile(answers, 0.99) / percentile(base.acks, 0.99):.2f}")
    else:
        print()
    for w in windows:
        if w.errors:
            print(f"  {w.label}: other errors {dict(w.errors)}")
    during = [t - stalled.began for t in stalled.acked_at if t < stalled.ended]
    # an ack while Redis is stopped would name an interaction no takeover could read yet
    print(f"  acks of the stall's interactions while redis-server was stopped: {len(during)}; after its SIGCONT: "
          f"{len(stalled.acked_at) - len(during)}")  # fmt: skip
    print(f"session after the stall: {'streaming' if lived else 'ENDED: ' + (session.failure or 'session.done')}")
    print(f"its stop: {'session.done' if session.done is not None else 'no session.done'}; resumes {session.drops}")
    return 0 if lived and session.done is not None else 1


def by_kind(client: Any) -> str:
    """The `rtvideo:` keys by kind (their name up to the session id), with their bytes."""
    kinds: Counter[str] = Counter()
    counts: Counter[str] = Counter()
    for key in client.scan_iter(match="rtvideo:*", count=1000):
        kind = ":".join(key.decode(errors="replace").split(":")[:2])
        kinds[kind] += client.memory_usage(key, samples=0) or 0
        counts[kind] += 1
    return ", ".join(f"{kind} {counts[kind]} key(s) {size} B" for kind, size in sorted(kinds.items())) or "none"


def store_bytes(client: Any) -> tuple[int, int]:
    """(keys, bytes) of every `rtvideo:` key, by MEMORY USAGE (every nested value sampled)."""
    keys = list(client.scan_iter(match="rtvideo:*", count=1000))
    return len(keys), sum(client.memory_usage(k, samples=0) or 0 for k in keys)


async def padded(run: LocalReplicas, args: argparse.Namespace) -> None:
    import redis

    client = redis.Redis.from_url(run.store_url)
    keys0, bytes0 = store_bytes(client)
    session = Session(run.url)
    await session.open(seed=12)
    window = Window("padded")
    session.window = window
    rate = RATE_LIMIT * args.rate_share
    print(
        f"\n2. bytes per session: interactions with a {args.pad} B pad at {rate:g}/s "
        f"(the rate limit {RATE_LIMIT:g}/s) for {args.minutes:g} min; before it the store held {keys0} keys, "
        f"{bytes0} B"
    )
    print(
        f"{'minute':>6} {'sent':>7} {'acked':>7} {'unavail':>7} {'other':>7} {'keys':>5} {'store B':>12} {'B/ack':>8}"
    )
    began = time.monotonic()
    next_report, minute = began + 60, 1
    for n in itertools.count():
        due = began + n / rate
        if due >= began + args.minutes * 60:
            break
        if due >= next_report:
            report_minute(client, window, minute)
            next_report, minute = next_report + 60, minute + 1
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        await session.interact(f"pad-{n}", f"a harbour, change {n}", pad=args.pad)
        if session.failure or session.done is not None:
            break
    await asyncio.sleep(3)
    report_minute(client, window, args.minutes)
    keys, size = store_bytes(client)
    print(f"store bytes for the session after {args.minutes:g} min: {size - bytes0} B in {keys - keys0} keys "
          f"({(size - bytes0) / max(args.minutes, 1e-9):.0f} B per minute on average); errors {dict(session.errors)}")  # fmt: skip
    print(f"  by kind: {by_kind(client)}")
    if session.failure:
        print(f"the session ended: {session.failure}")
    await session.stop()
    await asyncio.sleep(2)
    keys, size = store_bytes(client)
    print(f"after its stop: {keys} keys, {size} B in the store ({by_kind(client)})")
    client.close()


def report_minute(client: Any, window: Window, minute: float) -> None:
    keys, size = store_bytes(client)
    acked = len(window.acks)
    print(
        f"{minute:>6g} {window.sent:>7} {acked:>7} {window.store_unavailable:>7} {sum(window.errors.values()):>7} "
        f"{keys:>5} {size:>12} {size / max(acked, 1):8.0f}",
        flush=True,
    )


async def scenario(run: LocalReplicas, args: argparse.Namespace) -> int:
    code = await stall(run, args)
    await padded(run, args)
    return code


def evictions(count: int) -> None:
    """Part 3 (module docstring): the recordings store's eviction, beside the store's figures."""
    from bench_recordings import eviction_costs

    eviction_costs((10, 10_000), count)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="minutes of padded interactions (default 10)")
    parser.add_argument("--stall", type=float, default=8.0, help="seconds of each window; the stall's length")
    parser.add_argument("--rate", type=float, default=4.0, help="interactions per second around the stall")
    parser.add_argument("--pad", type=int, default=100_000, help="bytes of each padded interaction's pad")
    parser.add_argument(
        "--rate-share", type=float, default=0.95, help="the padded rate as a share of the rate limit (default 0.95)"
    )
    parser.add_argument("--logs", type=Path, help="keep the recipe's logs in this directory")
    parser.add_argument("--evictions", type=int, default=50, help="recordings evictions timed at 10 and 10,000")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        logs = args.logs or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-store-faults-")))
        run = stack.enter_context(
            LocalReplicas(logs, proxies=2, port=0, model=MODEL, triton_flags=("--max-sessions", "8"), say=False)
        )
        print(f"rtvideo replicas: two proxies sharing redis-server behind HAProxy at {run.url}")
        code = asyncio.run(scenario(run, args))
    if args.evictions > 0:
        evictions(args.evictions)
    sys.exit(code)


if __name__ == "__main__":
    main()
