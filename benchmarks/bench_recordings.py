"""What recordings and branches cost (docs/recordings.md): figures from one run, nothing asserted.

Starts its own tritonserver (256x256, 9 frames per chunk) and two proxies with
`--recordings` (one process each: `python -m rtvideo.cli serve --triton-url …`), then measures:

- branch latency by N: a recording of `--chunks` chunks (prompt updates and camera moves all
  along) is branched at chunk N; time from `session.start` with `from_recording` to
  `video.start` and to the first payload, median over `--repeats`, against a plain start's in
  the same run (the ratio is what rebuilding to chunk N adds);
- recording overhead on chunk lead: paced sessions with and without `"record": true`, in A-B-B-A
  order; the lead is how far the stream runs ahead of a player that started at the first
  payload (media seconds received minus wall seconds since), p50 and minimum over every chunk;
- the vLLM-Omni approximation's own cost (no Triton): finding and decoding the last frame of a
  fragment and making it a data URL (`rtvideo.proxy.placement.first_frame`), at the models' sizes, against
  encoding one chunk of the same frames (the baseline every chunk pays);
- what a burst of branches costs a bystander: a paced viewer's longest gap between two payloads
  while 15 branches of a large event log (`--log-mb`, grown from a real recording with long
  prompt updates) are started at once on its proxy, against the same viewer alone, in one run;
- one eviction of the recordings store (no Triton; `--eviction-only`): a store holding 10, then
  10,000 finished recordings (tiny ones, as refused or short sessions leave them) on a local
  folder, at its --recordings-max-count; a recording finishes (written through the store) and
  the time of the eviction it causes (the oldest removed), median over `--evictions`; the ratio
  of the two is what the number of recordings adds (the index makes it about 1). The store's
  one-time index at start is printed beside it.

    .venv/bin/python benchmarks/bench_recordings.py [--chunks 120] [--repeats 5] [--approximation-only]
        [--log-mb 40] [--branches 15] [--eviction-only] [--evictions 50]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import io
import json
import secrets
import shutil
import statistics
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from bench_common import PACED_PARAMS, UNPACED_PARAMS, bench_triton, percentile
from bench_proxy import ProxyProcess
from websockets.asyncio.client import connect

UNPACED, PACED = "realtime_video_unpaced", "realtime_video_paced"
OPEN: dict[str, Any] = {"max_size": None, "ping_interval": None, "proxy": None, "compression": None}
FPS, FRAMES_PER_CHUNK = 24, 9


def _interaction(k: int) -> dict[str, Any]:
    """The k-th interaction of the recorded session: prompts and camera moves alternate."""
    move = {"mode": "target", "data": {"translation": [0.1 * (k % 4), 0.05, 0.3]}}
    event = {"prompt": f"a landscape, variation {k}"} if k % 2 == 0 else {"multi_modal_data": {"camera": move}}
    return {"type": "session.interaction", "interaction": {"event_id": f"e{k}", "event": event}}


async def record(url: str, chunks: int) -> tuple[str, str]:
    """A recorded session of `chunks` chunks with an interaction every 5 chunks; its recording id
    and token."""
    async with connect(url, **OPEN) as ws:
        start = {"type": "session.start", "prompt": "a landscape", "seed": 7, "record": True}
        await ws.send(json.dumps({**start, "num_frames": chunks * FRAMES_PER_CHUNK}))
        rid, key, payloads = "", "", 0
        async for frame in ws:
            if isinstance(frame, bytes):
                payloads += 1
                if payloads % 5 == 0 and payloads < chunks - 5:
                    await ws.send(json.dumps(_interaction(payloads // 5)))
                continue
            message = json.loads(frame)
            if message["type"] == "video.start":
                rid, key = message["recording_id"], message["recording_token"]
            elif message["type"] == "error":
                raise RuntimeError(f"the recorded session failed: {message}")
            elif message["type"] == "session.done":
                break
        return rid, key


def manifest(url: str, rid: str, key: str) -> dict[str, Any]:
    """The recording's manifest ({} until the store has one)."""
    http = url.replace("ws://", "http://", 1).split("/v1/")[0]
    request = urllib.request.Request(f"{http}/v1/recordings/{rid}", headers={"Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return json.load(reply)
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return {}
        raise


async def first_payload(url: str, start: dict[str, Any]) -> tuple[float, float]:
    """Seconds from sending `start` to `video.start` and to the first payload; then stops."""
    async with connect(url, **OPEN) as ws:
        t0 = time.perf_counter()
        await ws.send(json.dumps(start))
        started = 0.0
        async for frame in ws:
            if isinstance(frame, bytes):
                if started:  # the init segment rides with the first chunk's pair
                    first = time.perf_counter() - t0
                    await ws.send(json.dumps({"type": "session.stop"}))
                    break
                continue
            message = json.loads(frame)
            if message["type"] == "video.start":
                started = time.perf_counter() - t0
            elif message["type"] in ("error", "session.done"):
                raise RuntimeError(f"the start was refused: {message}")
        async for _ in ws:  # drain to session.done
            pass
    return started, first


async def leads(url: str, record_it: bool, chunks: int) -> list[float]:
    """A paced session of `chunks` chunks: its lead over a player started at the first payload, per chunk."""
    out: list[float] = []
    async with connect(url, **OPEN) as ws:
        start = {"type": "session.start", "prompt": "a harbour", "num_frames": chunks * FRAMES_PER_CHUNK}
        await ws.send(json.dumps({**start, **({"record": True} if record_it else {})}))
        first, media, frames = 0.0, 0.0, 0
        async for frame in ws:
            now = time.perf_counter()
            if isinstance(frame, bytes):
                if frames:
                    first = first or now
                    media += frames / FPS
                    out.append(media - (now - first))
                continue
            message = json.loads(frame)
            frames = message.get("num_frames", 0) if message["type"] == "video.chunk_metadata" else 0
            if message["type"] == "session.done":
                break
    return out


def grow_log(store: Path, rid: str, megabytes: float) -> tuple[str, str]:
    """A copy of recording `rid` whose event log is grown to `megabytes` with prompt updates of
    4,000 characters (each acked, none started: parsed, never replayed), as a long session with
    many steerers would leave; its new id and token (written into its manifest, as the proxy does)."""
    new_rid, key = secrets.token_hex(16), "rk1." + secrets.token_urlsafe(32)
    shutil.copytree(store / rid, store / new_rid)
    manifest_path = store / new_rid / "manifest.json"
    stored = json.loads(manifest_path.read_text())
    stored.update(recording_id=new_rid, recording_token_sha256=hashlib.sha256(key.encode()).hexdigest())
    manifest_path.write_text(json.dumps(stored))
    prompt = "a long and winding prompt " * 154
    with (store / new_rid / "events.jsonl").open("a") as log:
        k = 0
        while log.tell() < megabytes * 1e6:
            event = {"event_id": f"grown-{k}", "event": {"prompt": prompt}}
            sent = {"type": "session.interaction", "interaction": event}
            log.write(json.dumps({"t": 0.0, "dir": "in", "participant": "owner", "message": sent}) + "\n")
            acked = {"type": "session.interaction.queued", "event_id": f"grown-{k}"}
            log.write(json.dumps({"t": 0.0, "dir": "out", "message": acked}) + "\n")
            k += 1
    return new_rid, key


async def viewer_gaps(url: str, seconds: float, during: Any = None) -> tuple[float, Any]:
    """A paced viewer's longest wait between two payloads over `seconds` of its stream, with
    `during` (a coroutine) run once its first payload has arrived; and what `during` returned."""
    async with connect(url, **OPEN) as ws:
        await ws.send(json.dumps({"type": "session.start", "prompt": "a bystander", "num_frames": 9 * 400}))
        last, longest, ended, task = 0.0, 0.0, 0.0, None
        async for frame in ws:
            now = time.perf_counter()
            if not isinstance(frame, bytes):
                continue
            if last:
                longest = max(longest, now - last)
            else:
                ended = now + seconds
                task = asyncio.ensure_future(during) if during is not None else None
            last = now
            if now >= ended and (task is None or task.done()):
                break
        await ws.send(json.dumps({"type": "session.stop"}))
    return longest, (await task if task is not None else None)


async def burst(url: str, rid: str, key: str, count: int) -> dict[str, Any]:
    """`count` branches of `rid` started at once; each stops at its video.start. Their answers."""

    async def one() -> str:
        async with connect(url, **OPEN) as ws:
            spec = {"recording_id": rid, "generation_chunk_index": 2, "recording_token": key}
            await ws.send(json.dumps({"type": "session.start", "from_recording": spec}))
            answer = json.loads(await ws.recv())
            if answer["type"] == "video.start":
                await ws.send(json.dumps({"type": "session.stop"}))
            return str(answer.get("code") or answer["type"])

    t0 = time.perf_counter()
    answers = await asyncio.gather(*(one() for _ in range(count)))
    return {"answers": {a: answers.count(a) for a in set(answers)}, "seconds": time.perf_counter() - t0}


def branch_burst(triton_url: str, store: Path, rid: str, megabytes: float, count: int) -> None:
    """A bystander's longest gap while `count` branches of a large log start (module docstring)."""
    big, key = grow_log(store, rid, megabytes)
    size = (store / big / "events.jsonl").stat().st_size
    flags = ("--recordings", str(store), "--max-sessions-per-client", "64")
    with ProxyProcess(triton_url, PACED, flags) as proxy:
        alone, _ = asyncio.run(viewer_gaps(proxy.url, 8.0))
        busy, result = asyncio.run(viewer_gaps(proxy.url, 8.0, burst(proxy.url, big, key, count)))
    print(f"\n{count} branches of one {size / 1e6:.1f} MB event log, started at once beside a paced viewer")
    print(f"{'viewer':<22} {'longest gap (s)':>15}")
    print(f"{'alone':<22} {alone:15.3f}")
    print(f"{'during the branches':<22} {busy:15.3f}")
    print(f"ratio {busy / alone:.2f}; the branches took {result['seconds']:.1f} s, answers {result['answers']}")


def approximation_costs(repeats: int) -> None:
    """What an approximate branch or move spends on its first frame, by size (module docstring)."""
    import numpy as np

    from rtvideo.backend.builtin.generator import BuiltinGenerator
    from rtvideo.backend.media.encoder import FragmentedMp4Encoder
    from rtvideo.proxy.placement import first_frame

    generator = BuiltinGenerator(device="cpu", fps=16)
    print("\nthe approximation's first frame (ms, median): fragment found and decoded, data URL made;")
    print("against encoding one 9-frame chunk of the same frames")
    print(f"{'size':<9} {'decode':>7} {'url':>7} {'url KiB':>8} {'encode':>7} {'ratio':>6}")
    for width, height in ((640, 384), (832, 480), (1280, 704)):
        session = generator.open_session(width=width, height=height, seed=3)
        chunks = [session.generate({"a harbour at dusk with boats": 1.0}, FRAMES_PER_CHUNK) for _ in range(2)]
        encoder = FragmentedMp4Encoder(width, height, 16)
        video = encoder.encode_chunk(chunks[0])
        t0 = time.perf_counter()
        video += encoder.encode_chunk(chunks[1])
        encode = time.perf_counter() - t0
        decodes, urls = [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            rgb = first_frame.last_frame(*first_frame.fragment_of(io.BytesIO(video), 1))
            t1 = time.perf_counter()
            url = first_frame.image_url(rgb)
            decodes.append(t1 - t0)
            urls.append(time.perf_counter() - t1)
        assert np.abs(rgb.astype(int) - chunks[1][-1]).mean() < 3  # the frame the viewer saw
        cost = statistics.median(decodes) + statistics.median(urls)
        print(
            f"{width}x{height:<5} {statistics.median(decodes) * 1e3:7.1f} {statistics.median(urls) * 1e3:7.1f} "
            f"{len(url) / 1024:8.0f} {encode * 1e3:7.1f} {cost / encode:6.2f}"
        )


def _tiny_recordings(root: Path, count: int) -> None:
    """`count` finished recordings as short sessions leave them: a few hundred bytes each."""
    import os

    started = time.time() - 3600.0
    for k in range(count):
        rid = secrets.token_hex(16)
        folder = root / rid
        os.mkdir(folder)
        (folder / "video.mp4").write_bytes(b"")
        (folder / "events.jsonl").write_text('{"t":0,"dir":"in","message":{"type":"session.start"}}\n')
        manifest = {"recording_id": rid, "status": "complete", "started_at": started + k, "ended_at": started + k}
        (folder / "manifest.json").write_text(json.dumps(manifest))


def eviction_costs(counts: tuple[int, ...], evictions: int) -> None:
    """One eviction's time at each number of recordings (module docstring)."""
    from rtvideo.proxy.recordings.backing import LocalBacking
    from rtvideo.proxy.recordings.store import Limits, RecordingStore

    print(f"\none recordings eviction (ms, median of {evictions}): a store at --recordings-max-count N,")
    print("a recording finishes and the oldest goes; and the store's index at start (s, once)")
    print("beside it, one such folder removed alone (ms, median): the filesystem's part")
    print(f"{'recordings':>10} {'eviction':>9} {'p90':>7} {'rmtree alone':>13} {'index (s)':>9}")
    medians = {}
    for count in counts:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            _tiny_recordings(root, count)
            unbounded = Limits(max_bytes=1 << 40, max_age=0, per_recording=1 << 30)
            store = RecordingStore(LocalBacking(root), unbounded)
            t0 = time.perf_counter()
            store.index()
            indexed = time.perf_counter() - t0
            bounded = Limits(max_bytes=1 << 40, max_age=0, per_recording=1 << 30, max_count=count)
            times, alone = [], []
            for _ in range(evictions):
                spare = root / "spare"  # the filesystem's own cost: one such folder removed, in the same folder
                spare.mkdir()
                (spare / "events.jsonl").write_bytes(b"x" * 60)
                (spare / "manifest.json").write_bytes(b"x" * 120)
                t0 = time.perf_counter()
                shutil.rmtree(spare)
                alone.append(time.perf_counter() - t0)
                store.limits = unbounded  # the new one is written and finished without evicting
                rid = secrets.token_hex(16)
                spool = store.begin(rid, {"recording_id": rid, "started_at": time.time()})
                line = b'{"t":0,"dir":"in","message":{"type":"session.start"}}\n'
                store.charge(rid, [("events.jsonl", len(line))])
                (spool / "events.jsonl").write_bytes(line)
                store.finish(rid, {"recording_id": rid, "status": "complete", "started_at": time.time()})
                store.limits = bounded
                t0 = time.perf_counter()
                removed = store.evict()
                times.append(time.perf_counter() - t0)
                assert len(removed) == 1, removed
            medians[count] = statistics.median(times)
            print(
                f"{count:>10} {medians[count] * 1e3:9.3f} {percentile(times, 0.9) * 1e3:7.3f} "
                f"{statistics.median(alone) * 1e3:13.3f} {indexed:9.2f}"
            )
    low, high = min(counts), max(counts)
    print(f"ratio {high} / {low} recordings: {medians[high] / medians[low]:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=120, help="chunks of the recorded session")
    parser.add_argument("--repeats", type=int, default=5, help="starts per branch point")
    parser.add_argument("--lead-chunks", type=int, default=40, help="chunks per paced session (lead)")
    parser.add_argument("--approximation-only", action="store_true", help="only the approximation's cost")
    parser.add_argument("--log-mb", type=float, default=40.0, help="size of the event log the burst branches")
    parser.add_argument("--branches", type=int, default=15, help="branches started at once beside the viewer")
    parser.add_argument("--burst-only", action="store_true", help="only the branch burst beside a viewer")
    parser.add_argument("--eviction-only", action="store_true", help="only the recordings store's eviction")
    parser.add_argument("--evictions", type=int, default=50, help="evictions timed at each number of recordings")
    args = parser.parse_args()
    if args.eviction_only:
        eviction_costs((10, 10_000), args.evictions)
        return
    if not args.burst_only:
        approximation_costs(args.repeats)
    if args.approximation_only:
        return
    if not args.burst_only:
        eviction_costs((10, 10_000), args.evictions)
    with (
        tempfile.TemporaryDirectory() as tmp,
        bench_triton({UNPACED: UNPACED_PARAMS, PACED: PACED_PARAMS}) as server,
        ProxyProcess(
            server.grpc_url, UNPACED, ("--recordings", f"{tmp}/fast", "--max-sessions-per-client", "64")
        ) as fast,
        ProxyProcess(server.grpc_url, PACED, ("--recordings", f"{tmp}/paced")) as paced,
    ):
        print(f"tritonserver ready in {server.startup_seconds:.1f} s (256x256, {FRAMES_PER_CHUNK} frames per chunk)")
        t0 = time.perf_counter()
        rid, key = asyncio.run(record(fast.url, args.chunks))
        while (stored := manifest(fast.url, rid, key)).get("status") in (None, "recording"):
            time.sleep(0.2)
        took = time.perf_counter() - t0
        print(f"recorded {stored.get('chunks')} chunks in {took:.1f} s (unpaced), status {stored['status']}")
        branch_burst(server.grpc_url, Path(tmp) / "fast", rid, args.log_mb, args.branches)
        if args.burst_only:
            return

        plain = {"type": "session.start", "prompt": "a landscape", "seed": 7}
        asyncio.run(first_payload(fast.url, plain))  # warm-up
        print("\nbranch latency (ms, median): start sent -> video.start, -> first payload; ratio to a plain start")
        print(f"{'start':<12} {'video.start':>11} {'first':>8} {'ratio':>6}")
        base: float | None = None
        points = [n for n in (1, 10, 50, 100, args.chunks - 1) if n < args.chunks]
        for label, start in [("plain", plain)] + [
            (
                f"N={n}",
                {
                    "type": "session.start",
                    "from_recording": {"recording_id": rid, "generation_chunk_index": n, "recording_token": key},
                },
            )
            for n in sorted(set(points))
        ]:
            runs = [asyncio.run(first_payload(fast.url, start)) for _ in range(args.repeats)]
            started = statistics.median(r[0] for r in runs)
            first = statistics.median(r[1] for r in runs)
            base = base or first
            print(f"{label:<12} {started * 1e3:11.1f} {first * 1e3:8.1f} {first / base:6.2f}")

        print("\nchunk lead of a paced session (s): media received minus wall time since the first payload")
        print(f"{'recorded':<9} {'chunks':>6} {'p50':>7} {'min':>7}")
        results: dict[bool, list[float]] = {False: [], True: []}
        for record_it in (False, True, True, False):  # A-B-B-A
            results[record_it] += asyncio.run(leads(paced.url, record_it, args.lead_chunks))
        for record_it, values in results.items():
            print(f"{record_it!s:<9} {len(values):>6} {percentile(values, 0.5):7.3f} {min(values):7.3f}")
        off, on = percentile(results[False], 0.5), percentile(results[True], 0.5)
        print(f"recording changes the p50 lead by {on - off:+.3f} s (ratio {on / off:.3f})")


if __name__ == "__main__":
    main()
