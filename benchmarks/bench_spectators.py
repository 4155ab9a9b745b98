"""What one proxy spends per spectator of a session, by transport: the WebSocket watch door
(docs/protocol.md §9.2), WHEP (§9.5) and an HLS broadcast served from the proxy's folder; and how
many spectators of one session one proxy holds at real time. Prints figures; asserts nothing.

    .venv/bin/python benchmarks/bench_spectators.py [--spectators 4] [--seconds 20] [--max-spectators 32]

One tritonserver (the built-in generator, the shipped pacing) and one `rtvideo serve --triton-url`
proxy in its own process with `--broadcast-store` a temporary folder. One owner (a WebSocket) starts
a session with `"watchable": true` and `"broadcast": true` and reads it to the end; spectators are
real clients on loopback, in this process:

- watch: a `websockets` client of `/v1/realtime/video/watch?watch_token=…`, reading every message;
- whep: aiortc's RTCPeerConnection (tests/support/whep_client.py's offer and POST) with the watch
  token; aiortc decodes every frame it receives (its receiver always does), frames are counted;
- hls: plain HTTP GETs of the playlist (every half segment) and of each new segment, from the live
  edge on, as a player does; with `--broadcast-base-url` a CDN serves these and the proxy none.

**Cost.** A phase with no spectators (the owner alone, before and after the others: the baseline)
and one phase per transport with `--spectators` spectators, each `--seconds` long once they all
play. The proxy's CPU (user + system of its process and any children, /proc) above the baseline's
rate, per spectator per minute of the session's video (the owner's media seconds in the phase);
its resident memory then minus just before the spectators came, per spectator; the bytes each
spectator received (WebSocket messages; the DTLS transport's bytes from aiortc's stats, RTP and
RTCP; HTTP bodies), per minute of video.

**Capacity.** Per transport, spectators are added in steps (1, 2, 4, … up to `--max-spectators`);
after each step the media every spectator received over `--window` seconds is compared with the
owner's over the same window (one chunk of slack: `keeping_up`): the proxy holds a step at real
time while the slowest spectator gets at least `--realtime` of it. The ramp stops at the first step that fails (or the
bound). The spectators run on the same cores as the proxy (and aiortc's decoding costs more than
the proxy's sending), so on a small machine this finds the machine's limit, an upper bound on
the clients, a lower bound on the proxy: the CPU figures say which.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiortc import RTCSessionDescription
from bench_common import PACED_PARAMS, bench_triton, family
from bench_proxy import ProxyProcess
from tornado.httpclient import AsyncHTTPClient, HTTPRequest
from websockets.asyncio.client import connect

# The WHEP client the end-to-end tests use lives with them, in tests/support.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.support.whep_client import offer, post

MODEL = "realtime_video_spectators"
TRANSPORTS = ("watch", "whep", "hls")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


# --- the proxy's process, read from /proc ---------------------------------------------------------
@dataclass(frozen=True)
class Usage:
    """CPU seconds (user + system) and resident bytes of a process and its children, at `at`."""

    at: float
    cpu: float
    rss: int


def usage(root: int) -> Usage:
    cpu, rss = 0.0, 0
    for pid in family(root):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            cpu += (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime
            rss += int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
    return Usage(time.monotonic(), cpu, rss)


# --- pure parts -----------------------------------------------------------------------------------
def parse_playlist(text: str) -> tuple[int, list[tuple[int, float]], bool]:
    """An HLS media playlist: its media sequence, its segments as (sequence, seconds) in order, and
    whether it has ended (EXT-X-ENDLIST). Segment N's file is `N.m4s` (proxy/broadcasts/playlist.py),
    but the sequence is counted from EXT-X-MEDIA-SEQUENCE as RFC 8216 says, not read from names."""
    sequence, ended, duration = 0, False, None
    segments: list[tuple[int, float]] = []
    for line in (line.strip() for line in text.splitlines()):
        if line.startswith("#EXT-X-MEDIA-SEQUENCE:"):
            sequence = int(line.split(":", 1)[1])
        elif line.startswith("#EXTINF:"):
            duration = float(line.split(":", 1)[1].split(",", 1)[0])
        elif line == "#EXT-X-ENDLIST":
            ended = True
        elif line and not line.startswith("#") and duration is not None:
            segments.append((sequence + len(segments), duration))
            duration = None
    return sequence, segments, ended


def steps(bound: int) -> list[int]:
    """The ramp's spectator counts: 1, 2, 4, … and `bound` itself last."""
    out, n = [], 1
    while n < bound:
        out.append(n)
        n *= 2
    return [*out, bound] if bound >= 1 else []


@dataclass(frozen=True)
class Cost:
    """What one spectator costs the proxy, from a phase and the baseline's rate."""

    cpu_per_video_minute: float  # CPU seconds per minute of the session's video
    rss: float  # bytes
    bytes_per_video_minute: float  # bytes the spectator received


def cost(
    before: Usage,
    after: Usage,
    rss_before: int,
    baseline_cpu_rate: float,
    spectators: int,
    video_seconds: float,
    received: int,
) -> Cost:
    """Per spectator: CPU above the baseline's rate (CPU seconds per wall second with no
    spectators) over the phase, per minute of video; memory then minus before they came; bytes."""
    minutes = video_seconds / 60.0
    if spectators < 1 or minutes <= 0:
        return Cost(float("nan"), float("nan"), float("nan"))
    extra = (after.cpu - before.cpu) - baseline_cpu_rate * (after.at - before.at)
    return Cost(
        extra / spectators / minutes,
        (after.rss - rss_before) / spectators,
        received / spectators / minutes,
    )


def held(ramp: list[tuple[int, float]], realtime: float) -> tuple[int, bool]:
    """The most spectators held at real time (the slowest's fraction of the owner's rate at
    least `realtime`), from (spectators, slowest fraction) in ramp order; and whether the ramp
    found the limit (a step failed) rather than stopped at its bound."""
    best = 0
    for count, slowest in ramp:
        if slowest < realtime:
            return best, True
        best = count
    return best, False


def keeping_up(deltas: list[float], owner_delta: float, chunk_seconds: float) -> float:
    """The slowest spectator's media over the owner's in one window, with one chunk of slack: a
    spectator that keeps up trails the owner by up to a chunk at either end of the window (WHEP
    sends a chunk's frames over its duration, HLS lists a chunk once it is whole and is polled),
    so it may count a chunk less than the owner. At most 1; 0 with no spectators or no media."""
    if not deltas or owner_delta <= 0:
        return 0.0
    return min(1.0, (min(deltas) + chunk_seconds) / owner_delta)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transports", default=",".join(TRANSPORTS), help="comma-separated, of watch, whep, hls")
    parser.add_argument("--spectators", type=int, default=4, help="spectators per transport in the cost phases")
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds each cost phase is measured")
    parser.add_argument("--max-spectators", type=int, default=32, help="the ramp's bound (0: no ramp)")
    parser.add_argument("--window", type=float, default=10.0, help="seconds each ramp step is measured")
    parser.add_argument("--realtime", type=float, default=0.9, help="the slowest spectator's rate over the owner's")
    parser.add_argument("--size", default="256x256", help="the session's WIDTHxHEIGHT")
    parser.add_argument("--json", action="store_true", help="also print every figure as one JSON line")
    args = parser.parse_args(argv)
    args.transports = [t for t in args.transports.split(",") if t]
    if not args.transports or any(t not in TRANSPORTS for t in args.transports):
        parser.error(f"--transports: some of {', '.join(TRANSPORTS)}")
    if args.spectators < 1 or args.max_spectators < 0 or args.seconds <= 0 or args.window <= 0:
        parser.error("--spectators, --seconds and --window must be positive, --max-spectators >= 0")
    if not 0 < args.realtime <= 1:
        parser.error("--realtime is a fraction in (0, 1]")
    try:
        args.width, args.height = (int(v) for v in args.size.lower().split("x"))
    except ValueError:
        parser.error("--size: WIDTHxHEIGHT")
    return args


# --- clients --------------------------------------------------------------------------------------
class Owner:
    """The session's owner: starts it watchable and broadcast, reads it all."""

    def __init__(self, url: str, width: int, height: int) -> None:
        self.url, self.width, self.height = url, width, height
        self.media = 0.0  # media seconds received
        self.start: dict[str, Any] = {}
        self.started = asyncio.Event()
        self.done = asyncio.Event()
        self._ws: Any = None

    async def run(self) -> None:
        async with connect(self.url, max_size=None, proxy=None, compression=None) as ws:
            self._ws = ws
            start = {"type": "session.start", "prompt": "spectators benchmark", "seed": 7}
            start |= {"width": self.width, "height": self.height, "watchable": True, "broadcast": True}
            await ws.send(json.dumps(start))
            async for message in ws:
                if isinstance(message, bytes):
                    continue
                m = json.loads(message)
                if m["type"] == "video.start":
                    self.start = m
                    self.started.set()
                elif m["type"] == "video.chunk_metadata" and m.get("kind") == "media":
                    self.media += m["num_frames"] / self.start["config"]["fps"]
                elif m["type"] in ("session.done", "error") and not self.started.is_set():
                    raise RuntimeError(f"the session did not start: {m}")
        self.done.set()

    async def stop(self) -> None:
        if self._ws is not None:
            with contextlib.suppress(Exception):
                await self._ws.send(json.dumps({"type": "session.stop"}))


class Spectator:
    """One spectator: media seconds and bytes received so far; `run` until cancelled."""

    def __init__(self) -> None:
        self.media = 0.0
        self.received = 0
        self.playing = asyncio.Event()  # the first media came
        self.error: str | None = None

    async def run(self) -> None:
        raise NotImplementedError

    async def settle(self) -> None:
        """Brings `received` up to date (where a transport counts elsewhere)."""


class WatchSpectator(Spectator):
    def __init__(self, url: str, fps: float) -> None:
        super().__init__()
        self.url, self.fps = url, fps

    async def run(self) -> None:
        async with connect(self.url, max_size=None, proxy=None, compression=None) as ws:
            async for message in ws:
                self.received += len(message)
                if isinstance(message, str):
                    m = json.loads(message)
                    if m["type"] == "video.chunk_metadata" and m.get("kind") == "media":
                        self.media += m["num_frames"] / self.fps
                        self.playing.set()


class WhepSpectator(Spectator):
    def __init__(self, base: str, token: str, fps: float) -> None:
        super().__init__()
        self.base, self.token, self.fps = base, token, fps
        self.pc: Any = None

    async def run(self) -> None:
        pc, sdp = await offer()
        self.pc = pc
        tracks: asyncio.Queue[Any] = asyncio.Queue()
        pc.on("track", tracks.put_nowait)
        try:
            headers = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/sdp"}
            response = await post(self.base, sdp.encode(), headers)
            if response.code != 201:
                raise RuntimeError(f"WHEP POST answered {response.code}: {response.body!r}")
            await pc.setRemoteDescription(RTCSessionDescription(sdp=response.body.decode(), type="answer"))
            track = await tracks.get()
            while True:
                await track.recv()  # aiortc has decoded it; counted, not kept
                self.media += 1 / self.fps
                self.playing.set()
        finally:
            await self.settle()
            await pc.close()

    async def settle(self) -> None:
        if self.pc is None:
            return
        with contextlib.suppress(Exception):
            report = await self.pc.getStats()
            # the transport's bytes (SRTP packets, RTCP included): aiortc's inbound-rtp has none
            self.received = sum(getattr(s, "bytesReceived", 0) for s in report.values() if s.type == "transport")


class HlsSpectator(Spectator):
    def __init__(self, playlist_url: str) -> None:
        super().__init__()
        self.url = playlist_url
        self.base = playlist_url.rsplit("/", 1)[0] + "/"

    async def _get(self, url: str) -> bytes:
        response = await AsyncHTTPClient().fetch(HTTPRequest(url, request_timeout=30))
        self.received += len(response.body)
        return response.body

    async def run(self) -> None:
        await self._get(self.base + "init.mp4")
        last: int | None = None
        while True:
            _, segments, ended = parse_playlist((await self._get(self.url)).decode())
            if last is None and segments:  # a player joins near the live edge: here, at it
                last = segments[-1][0] - 1
            for sequence, seconds in segments:
                if last is not None and sequence > last:
                    await self._get(f"{self.base}{sequence}.m4s")
                    self.media += seconds
                    self.playing.set()
                    last = sequence
            if ended:
                return
            await asyncio.sleep(max(0.1, (segments[-1][1] if segments else 0.5) / 2))


# --- phases ---------------------------------------------------------------------------------------
class Crowd:
    """Spectators of one transport, each a task; added in steps, all cancelled at the end."""

    def __init__(self, make: Callable[[], Spectator]) -> None:
        self.make = make
        self.members: list[tuple[Spectator, asyncio.Task[None]]] = []

    async def grow(self, count: int, timeout: float = 60.0) -> None:
        new = [self.make() for _ in range(count - len(self.members))]
        for s in new:
            self.members.append((s, asyncio.ensure_future(s.run())))
        waits = [asyncio.ensure_future(s.playing.wait()) for s in new]
        _, pending = await asyncio.wait(waits, timeout=timeout)
        for w in pending:
            w.cancel()
        failed = [t.exception() for _, t in self.members if t.done() and not t.cancelled() and t.exception()]
        if failed or pending:
            raise RuntimeError(f"{len(pending)} spectators did not start; {failed[:3]}")

    async def snapshot(self) -> list[tuple[float, int]]:
        for s, _ in self.members:
            await s.settle()
        return [(s.media, s.received) for s, _ in self.members]

    def failed(self) -> list[str]:
        """Why spectators ended on their own (a refusal, a closed connection), one line each."""
        return [repr(t.exception()) for _, t in self.members if t.done() and not t.cancelled() and t.exception()]

    async def close(self) -> None:
        for _, task in self.members:
            task.cancel()
        for _, task in self.members:
            with contextlib.suppress(BaseException):
                await task
        self.members = []


async def measure(pid: int, owner: Owner, crowd: Crowd | None, seconds: float) -> dict[str, Any]:
    """Over `seconds`: the proxy's usage, the owner's media, each spectator's media and bytes."""
    before, media0 = usage(pid), owner.media
    spectators0 = await crowd.snapshot() if crowd else []
    await asyncio.sleep(seconds)
    spectators1 = await crowd.snapshot() if crowd else []
    after, media1 = usage(pid), owner.media
    wall = after.at - before.at
    return {
        "before": before,
        "after": after,
        "owner_rate": (media1 - media0) / wall,
        "video_seconds": media1 - media0,
        "deltas": [m1 - m0 for (m0, _), (m1, _) in zip(spectators0, spectators1, strict=True)],
        "received": sum(b1 - b0 for (_, b0), (_, b1) in zip(spectators0, spectators1, strict=True)),
    }


def factory(transport: str, owner: Owner, ws_url: str) -> Callable[[], Spectator]:
    http = ws_url.replace("ws://", "http://").split("/v1/")[0]
    fps = float(owner.start["config"]["fps"])
    token = owner.start["watch_token"]
    if transport == "watch":
        return lambda: WatchSpectator(f"{ws_url}/watch?watch_token={token}", fps)
    if transport == "whep":
        return lambda: WhepSpectator(http, token, fps)
    url = owner.start["broadcast_url"]
    return lambda: HlsSpectator(url if url.startswith("http") else http + url)


@contextlib.contextmanager
def proxy(grpc_url: str, store: str, most: int) -> Iterator[ProxyProcess]:
    # every spectator comes from 127.0.0.1: the per-address bound would be the limit found
    flags = (
        *("--broadcast-store", store, "--max-watchers-per-session", str(most), "--max-watchers", str(most)),
        *("--max-open-connections-per-client", str(2 * most + 16)),
    )
    with ProxyProcess(grpc_url, MODEL, flags=flags) as p:
        yield p


def mib(n: float) -> str:
    return f"{n / 2**20:8.2f}"


async def bench(args: argparse.Namespace, ws_url: str, pid: int) -> dict[str, Any]:
    AsyncHTTPClient.configure(None, max_clients=max(64, 2 * args.max_spectators))
    owner = Owner(ws_url, args.width, args.height)
    owner_task = asyncio.ensure_future(owner.run())
    await asyncio.wait_for(owner.started.wait(), 120)
    while owner.media < 2.0:  # playing (and its broadcast has segments)
        await asyncio.sleep(0.1)
    print(f"session {args.width}x{args.height} at {owner.start['config']['fps']} fps; proxy pid {pid}", flush=True)
    config = owner.start["config"]
    chunk = config["frames_per_chunk"] / config["fps"]
    out: dict[str, Any] = {"cost": {}, "ramp": {}}
    try:
        base = [await measure(pid, owner, None, args.seconds)]
        rate = (base[0]["after"].cpu - base[0]["before"].cpu) / (base[0]["after"].at - base[0]["before"].at)
        print(
            f"baseline (the owner alone): proxy CPU {rate:.3f} s/s, RSS {mib(base[0]['after'].rss)} MiB, "
            f"owner at {base[0]['owner_rate']:.2f}x real time",
            flush=True,
        )
        print(
            f"{'transport':>9} {'spectators':>10} {'CPU s / video min':>17} {'RSS MiB':>8} {'MiB / video min':>15} "
            f"{'slowest/owner':>13} {'owner x rt':>10}  (per spectator)"
        )
        for transport in args.transports:
            crowd = Crowd(factory(transport, owner, ws_url))
            rss_before = usage(pid).rss
            try:
                await crowd.grow(args.spectators)
                await asyncio.sleep(2.0)  # past the joins
                m = await measure(pid, owner, crowd, args.seconds)
            finally:
                await crowd.close()
            c = cost(m["before"], m["after"], rss_before, rate, args.spectators, m["video_seconds"], m["received"])
            slowest = keeping_up(m["deltas"], m["video_seconds"], chunk)
            out["cost"][transport] = {**c.__dict__, "slowest": slowest, "owner_rate": m["owner_rate"]}
            print(
                f"{transport:>9} {args.spectators:>10} {c.cpu_per_video_minute:17.3f} {mib(c.rss)} "
                f"{c.bytes_per_video_minute / 2**20:15.3f} {slowest:13.2f} {m['owner_rate']:10.2f}",
                flush=True,
            )
            await asyncio.sleep(2.0)  # the proxy lets go of them
        base.append(await measure(pid, owner, None, args.seconds / 2))
        again = (base[1]["after"].cpu - base[1]["before"].cpu) / (base[1]["after"].at - base[1]["before"].at)
        print(f"baseline again (drift): proxy CPU {again:.3f} s/s", flush=True)
        if args.max_spectators:
            print(f"capacity: spectators of one session at real time (slowest >= {args.realtime:.2f} x the owner)")
            for transport in args.transports:
                crowd = Crowd(factory(transport, owner, ws_url))
                ramp: list[tuple[int, float]] = []
                try:
                    for count in steps(args.max_spectators):
                        try:
                            await crowd.grow(count)
                        except RuntimeError as e:
                            print(f"{transport:>9} {count:>4}: {e}", flush=True)
                            ramp.append((count, 0.0))
                            break
                        await asyncio.sleep(1.0)
                        m = await measure(pid, owner, crowd, args.window)
                        slowest = keeping_up(m["deltas"], m["video_seconds"], chunk)
                        cpu = (m["after"].cpu - m["before"].cpu) / (m["after"].at - m["before"].at)
                        ramp.append((count, slowest))
                        print(
                            f"{transport:>9} {count:>4}: slowest {slowest:.2f} x owner, owner {m['owner_rate']:.2f}x "
                            f"real time, proxy CPU {cpu:.2f} s/s, RSS {mib(m['after'].rss)} MiB"
                            + (f"; {len(failed)} ended: {failed[:2]}" if (failed := crowd.failed()) else ""),
                            flush=True,
                        )
                        if slowest < args.realtime:
                            break
                finally:
                    await crowd.close()
                most, limited = held(ramp, args.realtime)
                out["ramp"][transport] = {"steps": ramp, "held": most, "limit_found": limited}
                bound = "" if limited else f" (the bound, {args.max_spectators}: no limit found)"
                print(f"{transport:>9} holds {most} spectators at real time{bound}", flush=True)
                await asyncio.sleep(2.0)
    finally:
        await owner.stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(owner_task, 30)
    return out


def main() -> None:
    args = parse_args()
    most = max(args.spectators, args.max_spectators) + 4
    with (
        bench_triton({MODEL: PACED_PARAMS}) as server,
        tempfile.TemporaryDirectory() as store,
        proxy(server.grpc_url, store, most) as p,
    ):
        assert p.proc is not None
        print(f"tritonserver ready in {server.startup_seconds:.1f} s; proxy {p.url}; HLS served from {store}")
        out = asyncio.run(bench(args, p.url, p.proc.pid))
        if args.json:
            print(json.dumps(out, default=lambda o: o.__dict__))


if __name__ == "__main__":
    main()
