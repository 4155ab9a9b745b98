"""What steerers cost: interaction ack latency with steerers joined to each session, against the
same run without (docs/protocol.md §9.3).

Starts its own tritonserver with the shipped pacing and one proxy process (`rtvideo serve`, its
own interpreter, as in production). Each session is steerable; in the steered run
`--steerers` steer links join every session and send updates at the owner's interval, each
timing its own acks (send → ack received by that sender); in the plain run only the owners send.
The two runs alternate in A-B-B-A order after a warm-up. Every ack is checked to reach its
sender only.

Prints figures; asserts nothing beyond the routing.
    .venv/bin/python benchmarks/bench_steerers.py [--sessions 8] [--steerers 8] [--samples 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import urllib.parse
from dataclasses import dataclass, field

from bench_common import PACED_PARAMS, bench_triton, percentile
from bench_proxy import ProxyProcess
from websockets.asyncio.client import ClientConnection, connect

MODEL = "realtime_video_paced"


@dataclass
class Acks:
    owner: list[float] = field(default_factory=list)  # seconds, send → ack, the owners' updates
    steerer: list[float] = field(default_factory=list)  # the steerers' updates
    misrouted: int = 0  # acks that reached a participant that did not send the event

    def merge(self, other: Acks) -> None:
        self.owner += other.owner
        self.steerer += other.steerer
        self.misrouted += other.misrouted


async def participant(
    ws: ClientConnection, name: str, samples: int, interval: float, times: list[float], acks: Acks, owner: bool
) -> None:
    """Send `samples` updates every `interval` s and read to session.done, timing its own acks."""
    sent_at: dict[str, float] = {}

    async def send() -> None:
        t0 = time.perf_counter()
        for k in range(samples):
            event_id = f"{name}-{k}"
            sent_at[event_id] = time.perf_counter()
            interaction = {"event_id": event_id, "event": {"prompt": f"{name} prompt {k % 5}"}, "transition_chunks": 2}
            await ws.send(json.dumps({"type": "session.interaction", "interaction": interaction}))
            await asyncio.sleep(max(0.0, t0 + (k + 1) * interval - time.perf_counter()))
        if owner:
            await asyncio.sleep(interval)
            await ws.send(json.dumps({"type": "session.stop"}))

    sender = asyncio.create_task(send())
    async for frame in ws:
        if isinstance(frame, bytes):
            continue
        message = json.loads(frame)
        if message["type"] == "session.interaction.queued":
            if message["event_id"] in sent_at:
                times.append(time.perf_counter() - sent_at.pop(message["event_id"]))
            else:
                acks.misrouted += 1
        elif message["type"] == "session.done":
            break
    await sender


async def session(url: str, index: int, steerers: int, samples: int, interval: float) -> Acks:
    acks = Acks()
    async with connect(url, max_size=None, proxy=None, compression=None) as ws:
        start = {"type": "session.start", "prompt": f"bench session {index}", "seed": index, "steerable": True}
        await ws.send(json.dumps(start))
        video_start = json.loads(await ws.recv())
        token = urllib.parse.quote(video_start["steer_token"])
        links = [
            await connect(f"{url}/steer?steer_token={token}", max_size=None, proxy=None, compression=None)
            for _ in range(steerers)
        ]
        try:
            for link in links:
                await link.recv()  # its video.start
            await asyncio.gather(
                participant(ws, f"o{index}", samples, interval, acks.owner, acks, True),
                *(
                    participant(link, f"s{index}-{j}", samples, interval, acks.steerer, acks, False)
                    for j, link in enumerate(links)
                ),
            )
        finally:
            for link in links:
                await link.close()
    return acks


def measure(url: str, sessions: int, steerers: int, samples: int, interval: float) -> Acks:
    async def all_sessions() -> list[Acks]:
        return await asyncio.gather(*(session(url, i, steerers, samples, interval) for i in range(sessions)))

    total = Acks()
    for acks in asyncio.run(all_sessions()):
        total.merge(acks)
    return total


def ms(values: list[float], q: float) -> str:
    return f"{percentile(values, q) * 1e3:8.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--steerers", type=int, default=8, help="steer links per session in the steered run")
    parser.add_argument("--samples", type=int, default=20, help="updates per participant and run")
    parser.add_argument("--interval", type=float, default=0.25, help="seconds between one participant's updates")
    args = parser.parse_args()
    links = args.sessions * (args.steerers + 1)  # all from this one address
    flags = (
        "--max-steerers-per-session",
        str(max(1, args.steerers)),
        "--max-open-connections-per-client",
        str(links + 64),
    )
    with bench_triton({MODEL: PACED_PARAMS}) as server, ProxyProcess(server.grpc_url, MODEL, flags) as proxy:
        print(f"tritonserver ready in {server.startup_seconds:.1f} s (256x256, 9 frames per chunk, paced)")
        measure(proxy.url, args.sessions, args.steerers, 4, 0.05)  # warm-up
        plain, steered = Acks(), Acks()
        for run in (plain, steered, steered, plain):  # A-B-B-A
            run.merge(
                measure(
                    proxy.url, args.sessions, args.steerers if run is steered else 0, args.samples // 2, args.interval
                )
            )
        print(f"\nack latency (ms), {args.sessions} sessions, an update every {args.interval:g} s per participant")
        print(f"{'run':<26} {'acks':>6} {'p50':>8} {'p99':>8} {'max':>8}")
        rows = (
            ("owners, no steerers", plain.owner),
            (f"owners, {args.steerers} steerers each", steered.owner),
            ("steerers", steered.steerer),
        )
        for label, values in rows:
            if values:
                print(f"{label:<26} {len(values):>6} {ms(values, 0.5)} {ms(values, 0.99)} {max(values) * 1e3:8.2f}")
        print(f"\nacks that reached a participant other than their sender: {plain.misrouted + steered.misrouted}")


if __name__ == "__main__":
    main()
