"""Soak: N sessions for M minutes through a real `rtvideo serve`, with hostile inputs, abrupt
disconnects and one `kill -9` of the model's stub half-way. Prints what was lost (must be 0
outside the killed window), RSS over time and the recovery time. Asserts nothing.

    .venv/bin/python benchmarks/soak.py --sessions 6 --minutes 10

Every session that the soak does not abandon itself is checked end to end: it ends with
`session.done`; transport indices have no gap; every interaction sent gets an ack or an error;
every acked event reaches exactly one end (completed / superseded / interrupted on a chunk,
`interaction_failed`, or unapplied / unfinished in `session.done`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench_common import parent_pids
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from rtvideo.core.errors import SESSION_ENDING_CODES
from rtvideo.triton.server import free_port

RTVIDEO = Path(sys.executable).parent / "rtvideo"
ENDING_CODES = {code.value for code in SESSION_ENDING_CODES}
END_KEYS = ("completed_event_ids", "superseded_event_ids", "interrupted_event_ids")
HOSTILE: list[str | bytes] = [
    "not json",
    "[1,2]",
    '{"type":"nope"}',
    '{"type":"session.start","prompt":"again"}',
    r'{"type":"session.interaction","interaction":{"event_id":"\ud800","event":{"prompt":"x"}}}',
    r'{"type":"session.interaction","interaction":{"event":{"prompt":"\udfff"}}}',
    '{"type":"session.interaction","interaction":{"event":{"prompt":""}}}',
    '{"type":"session.interaction","interaction":{"event":{"prompt":"a"},"transition_chunks":-1}}',
    '{"type":"session.ping","pad":"' + "x" * 200_000 + '"}',
    b"\x00\x01binary",
]


@dataclass
class Tally:
    sessions: int = 0
    abandoned: int = 0  # disconnected on purpose: not checked
    in_kill_window: int = 0
    refused: int = 0  # 503/429 before the upgrade, or server_busy
    chunks: int = 0
    acks: int = 0
    hostile: int = 0
    lost_done: int = 0
    lost_acks: int = 0
    lost_ends: int = 0
    index_gaps: int = 0
    errors: dict[str, int] = field(default_factory=dict)


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def process_named(parent: int, name: str) -> int | None:
    for pid in (child for child, up in parent_pids().items() if up == parent):
        try:
            if name in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                return pid
        except OSError:
            continue
    return None


class Soak:
    def __init__(self, url: str, deadline: float, tally: Tally) -> None:
        self.url, self.deadline, self.t = url, deadline, tally
        self.kill_window: tuple[float, float] | None = None  # (kill time, recovered time)
        self.killed_at: float | None = None

    def overlaps_kill(self, start: float, end: float) -> bool:
        if self.killed_at is None:
            return False
        recovered = self.kill_window[1] if self.kill_window else float("inf")
        return start <= recovered and end >= self.killed_at - 1.0

    async def worker(self, seed: int) -> None:
        rng = random.Random(seed)
        while time.monotonic() < self.deadline:
            try:
                await self.session(rng)
            except InvalidStatus:
                self.t.refused += 1
                await asyncio.sleep(0.5)
            except (OSError, ConnectionClosed, asyncio.TimeoutError):
                await asyncio.sleep(0.5)

    async def session(self, rng: random.Random) -> None:
        opened = time.monotonic()
        async with connect(self.url, max_size=2**24, open_timeout=10) as conn:
            await conn.send(
                json.dumps(
                    {
                        "type": "session.start",
                        "prompt": f"scene {rng.random():.3f}",
                        "num_frames": rng.choice([None, 90, 180]),
                        "seed": rng.randrange(1000),
                    }
                )
            )
            abandon_after = rng.random() * 8 if rng.random() < 0.2 else None
            stop_after = 4 + rng.random() * 8
            sent_ids: set[str] = set()
            sent_at: dict[str, float] = {}  # last send of each id
            stopped_at = float("inf")
            reader = asyncio.create_task(self.read(conn))
            t0 = time.monotonic()
            try:
                while not reader.done():
                    elapsed = time.monotonic() - t0
                    if abandon_after is not None and elapsed > abandon_after:
                        reader.cancel()
                        self.t.abandoned += 1
                        return  # the context manager closes the socket mid-session
                    if elapsed > stop_after:
                        await conn.send('{"type":"session.stop"}')
                        stop_after, stopped_at = float("inf"), time.monotonic()
                    roll = rng.random()
                    if roll < 0.15:
                        raw = rng.choice(HOSTILE)
                        self.t.hostile += 1
                        await conn.send(raw)
                    elif roll < 0.75:
                        event_id = f"e{len(sent_ids)}" if rng.random() < 0.9 else rng.choice(sorted(sent_ids) or ["e0"])
                        sent_ids.add(event_id)
                        sent_at[event_id] = time.monotonic()
                        # a retry repeats its payload exactly: the payload is a function of the id
                        interaction: dict[str, Any] = {
                            "event_id": event_id,
                            "event": {"prompt": f"p {event_id}"},
                            "transition_chunks": int(event_id[1:]) % 4,
                        }
                        await conn.send(json.dumps({"type": "session.interaction", "interaction": interaction}))
                    else:
                        await conn.send('{"type":"session.ping"}')
                    await asyncio.sleep(rng.random() * 0.5)
                messages, ended_at = await reader
            finally:
                if not reader.done():
                    reader.cancel()
        self.t.sessions += 1
        if self.overlaps_kill(opened, time.monotonic()):
            self.t.in_kill_window += 1
            return
        # Interactions sent after the client's stop or just before the end may meet a closed
        # session (no answer); every other one must be answered.
        cutoff = min(stopped_at, ended_at) - 1.0
        self.check(messages, {e for e, at in sent_at.items() if at < cutoff})

    async def read(self, conn: ClientConnection) -> tuple[list[dict[str, Any]], float]:
        """Every message until `session.done` (binary frames as placeholders), and when the end
        began (the first session-ending message)."""
        messages: list[dict[str, Any]] = []
        ended_at = float("inf")
        async for frame in conn:
            if isinstance(frame, bytes):
                messages.append({"type": "<binary>", "length": len(frame)})
                continue
            message = json.loads(frame)
            messages.append(message)
            kind = message.get("type")
            if (kind == "error" and message.get("code") in ENDING_CODES) or kind == "session.done":
                ended_at = min(ended_at, time.monotonic())
            if kind == "session.done":
                break
        return messages, ended_at

    def check(self, messages: list[dict[str, Any]], sent_ids: set[str]) -> None:
        t = self.t
        if not messages or messages[-1].get("type") != "session.done":
            t.lost_done += 1
            return
        acked: set[str] = set()
        ended: dict[str, int] = {}
        indices = []
        for m in messages:
            kind = m.get("type")
            if kind == "error":
                t.errors[m["code"]] = t.errors.get(m["code"], 0) + 1
                if m["code"] == "interaction_failed" and m.get("event_id"):
                    ended[m["event_id"]] = ended.get(m["event_id"], 0) + 1
                if m["code"] == "server_busy":
                    t.refused += 1
            elif kind == "session.interaction.queued":
                acked.add(m["event_id"])
                t.acks += 1
            elif kind == "video.chunk_metadata":
                indices.append(m["transport_chunk_index"])
                t.chunks += m["kind"] == "media"
                for key in END_KEYS:
                    for event_id in m[key]:
                        ended[event_id] = ended.get(event_id, 0) + 1
        done = messages[-1]
        for event_id in done.get("unapplied_event_ids", []) + done.get("unfinished_event_ids", []):
            ended[event_id] = ended.get(event_id, 0) + 1
        if indices != list(range(len(indices))):
            t.index_gaps += 1
        t.lost_ends += sum(1 for e in acked if ended.get(e, 0) != 1)
        refused_start = any(m.get("code") == "server_busy" for m in messages if m.get("type") == "error")
        if not refused_start:  # every id sent was acked (or answered with an error naming it)
            answered = acked | {m.get("event_id") for m in messages if m.get("type") == "error"}
            t.lost_acks += len(sent_ids - answered)


async def main_async(args: argparse.Namespace) -> None:
    ports = [free_port() for _ in range(4)]
    log = Path(tempfile.mkstemp(prefix="soak-serve-", suffix=".log")[1])
    cmd = [
        str(RTVIDEO),
        "serve",
        "--port",
        str(ports[0]),
        "--triton-grpc-port",
        str(ports[1]),
        "--triton-metrics-port",
        str(ports[3]),
        "--probe-interval",
        "1",
        "--max-sessions",
        str(args.sessions + 2),
        "--max-sessions-per-client",
        str(args.sessions + 4),
        "--triton-log",
        str(log.with_suffix(".triton.log")),
    ]
    with log.open("wb") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        assert proc.stdout is not None
        if not select.select([proc.stdout], [], [], 300)[0]:
            raise SystemExit("rtvideo serve did not get ready:\n" + log.read_text()[-2000:])
        print(proc.stdout.readline().strip(), flush=True)
        url = f"ws://127.0.0.1:{ports[0]}/v1/realtime/video"
        tally = Tally()
        started = time.monotonic()
        soak = Soak(url, started + args.minutes * 60, tally)
        workers = [asyncio.create_task(soak.worker(args.seed + i)) for i in range(args.sessions)]
        rss: list[tuple[float, float, float, float]] = []
        killed = False
        recovery: float | None = None
        while time.monotonic() < soak.deadline:
            await asyncio.sleep(5)
            now = time.monotonic() - started
            triton = process_named(proc.pid, "tritonserver")
            stub = process_named(triton, "triton_python_backend_stub") if triton else None
            rss.append((now, rss_mb(proc.pid), rss_mb(triton or 0), rss_mb(stub or 0)))
            if not killed and now > args.minutes * 30 and stub:
                os.kill(stub, signal.SIGKILL)
                soak.killed_at = time.monotonic()
                killed = True
                print(f"t={now:.0f}s kill -9 stub {stub}", flush=True)
                recovery = await recovered(url, soak.killed_at)
                soak.kill_window = (soak.killed_at, soak.killed_at + (recovery or 0))
                print(
                    f"recovered: a new session streamed {recovery:.1f} s after the kill"
                    if recovery
                    else "NOT recovered within 120 s",
                    flush=True,
                )
        await asyncio.gather(*workers, return_exceptions=True)
        print("\nRSS (MB) over time: t, proxy (rtvideo serve), tritonserver, stub")
        for row in rss[:: max(1, len(rss) // 20)] + rss[-1:]:
            print(f"  {row[0]:6.0f} s  {row[1]:7.1f}  {row[2]:7.1f}  {row[3]:7.1f}")
        t = tally
        print(
            f"\nsessions checked {t.sessions - t.in_kill_window} (+{t.in_kill_window} in the kill window, "
            f"{t.abandoned} abandoned on purpose, {t.refused} refused), media chunks {t.chunks}, acks {t.acks}, "
            f"hostile messages {t.hostile}"
        )
        print(f"errors by code: {json.dumps(t.errors, sort_keys=True)}")
        print(
            f"lost outside the kill window: sessions without done {t.lost_done}, acks {t.lost_acks}, "
            f"event ends {t.lost_ends}, index gaps {t.index_gaps}"
        )
        print(f"recovery after stub kill: {recovery:.1f} s" if recovery else "recovery: none")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


async def recovered(url: str, since: float, limit: float = 120.0) -> float | None:
    """Seconds from `since` until a new session streams a media chunk."""
    while time.monotonic() - since < limit:
        try:
            async with connect(url, max_size=2**24, open_timeout=5) as conn:
                await conn.send('{"type":"session.start","prompt":"are you back","num_frames":9}')
                async for frame in conn:
                    if isinstance(frame, bytes):
                        return time.monotonic() - since
                    if json.loads(frame).get("type") == "session.done":
                        break
        except (InvalidStatus, OSError, ConnectionClosed, asyncio.TimeoutError):
            pass
        await asyncio.sleep(0.5)
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=6)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=1)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
