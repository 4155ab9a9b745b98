"""On-screen interaction latency: how long a prompt update takes to show in a real browser, with
the fixed-lead pacing and with pacing to the players' `session.playback` reports, side by side
in the same run. Prints figures; asserts nothing.

    .venv/bin/python benchmarks/bench_onscreen.py [--counts 1,8,16] [--seconds 20] [--configs playhead]

One tritonserver (the built-in generator, 256×256, 9 frames a chunk at 16 fps) and one
`rtvideo serve --triton-url` proxy; headless Chromium opens the proxy's page and plays N
sessions at once through `/rtvideo.js` and Media Source Extensions (one <video> each, all on
screen). Each session sends a prompt update at random times (a gap of `--gap` seconds on
average, uniformly ±40 %), so updates land anywhere between two chunk boundaries. For each
update the page records:

- on screen: send → the first frame of the first chunk listing it in `started_event_ids` is
  presented (`requestVideoFrameCallback`'s expected display time; polled `currentTime` where the
  browser lacks it). The chunk's media start is the frames before it / fps;
- arrived: send → that chunk's metadata reaching the page (what the older benchmarks call
  "update visible"); on screen minus arrived is the time the chunk waited in the player's buffer.

Per session it counts stalls (`waiting` events after playback began and before the stop; each
one's time after the first chunk and the player's lead then are printed under the row, so an
underrun, ~0 s buffered, tells apart from a decoder or page falling behind) and samples the
player's lead (buffered end − currentTime) every 100 ms. The two configurations:

- `fixed`: the page sends no reports (MsePlayer reportMs 0): the server paces to its fixed lead
  (`pacing_lead_chunks` 1.0), exactly as before playhead reports existed;
- `playhead`: the page reports its playhead 4 times a second (the default of rtvideo.js).

Each count runs both in the same browser against the same server, alternating `--rounds`
times (each round `--seconds / --rounds` of updates), so a drift in the machine's load hits
both alike; their figures are pooled per configuration (`--configs` picks some).

**MSE and WebRTC on the same sessions** (unless `--no-webrtc`): each session starts
`"watchable": true` and is watched twice in the same page, by its owner's MSE player above and by
a WHEP viewer (docs/protocol.md §9.5: Chromium's own RTCPeerConnection, a client of a few lines,
not rtvideo.js) holding the session's watch token. The same updates are timed on both: over
WebRTC, on screen is send → the presentation (`requestVideoFrameCallback`'s expected display
time) of the frame whose RTP timestamp is the first of the update's chunk. A WHEP viewer joins at
a chunk's IDR on an RTP clock with a random origin: its first frame is taken to be that of the
last chunk that reached the page before it was shown (`webrtc_shown`), which holds while the
WebRTC view trails the chunks' arrival by less than a chunk; the figure "chunk arrival → its
first WebRTC frame" is printed to show it does. Each row pair prints MSE p50 and p99 over
WebRTC's (the ratio). The pacing is the owner's (an MSE player's reports, or the fixed lead): the
WebRTC view is a watcher and reports nothing (a session watched only over WebRTC would pace to the
fixed lead, the `fixed` rows).
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import json
import math
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench_common import bench_triton, percentile
from bench_proxy import ProxyProcess
from websockets.sync.client import connect

MODEL = "realtime_video_onscreen"
CONFIGS = {"fixed": 0, "playhead": 250}  # name -> MsePlayer reportMs

#: runs in the proxy's page: N sessions at once, returns what each measured (JSON text)
PAGE_RUN = r"""
(async (cfg) => {
  const { RealtimeVideoClient, MsePlayer } = await import(cfg.base + "rtvideo.js");
  document.body.innerHTML = "";
  document.body.style.cssText = "margin:0;background:#000;display:flex;flex-wrap:wrap;gap:2px";
  const sleep = ms => new Promise(r => setTimeout(r, ms));
  // a WHEP client of a few lines (as docs/protocol.md §9.5 shows, not the page's own player):
  // each presented frame is kept as [its expected display time, its RTP timestamp]
  const whep = async (token, rtc) => {
    const video = document.createElement("video");
    video.muted = true; video.playsInline = true; video.autoplay = true;
    video.style.cssText = "width:150px;height:150px;outline:2px solid #06c";
    document.body.appendChild(video);
    const pc = new RTCPeerConnection();
    pc.addTransceiver("video", { direction: "recvonly" });
    pc.ontrack = e => { video.srcObject = new MediaStream([e.track]); video.play().catch(() => {}); };
    const onFrame = (now, m) => {
      if (pc.connectionState === "closed") return;
      if (typeof m.rtpTimestamp === "number") rtc.frames.push([m.expectedDisplayTime, m.rtpTimestamp]);
      video.requestVideoFrameCallback(onFrame);
    };
    video.requestVideoFrameCallback(onFrame);
    await pc.setLocalDescription(await pc.createOffer());
    await new Promise(ok => { if (pc.iceGatheringState === "complete") ok();
      else pc.onicegatheringstatechange = () => pc.iceGatheringState === "complete" && ok(); });
    const r = await fetch(cfg.base + "v1/realtime/video/whep", { method: "POST", body: pc.localDescription.sdp,
      headers: { "Content-Type": "application/sdp", Authorization: "Bearer " + token } });
    const body = await r.text();
    if (r.status !== 201) { pc.close(); throw new Error(`WHEP ${r.status}: ${body.slice(0, 200)}`); }
    await pc.setRemoteDescription({ type: "answer", sdp: body });
    return pc;
  };
  const one = async (index) => {
    await sleep(index * 60); // connect one after another, as independent viewers would
    const video = document.createElement("video");
    video.muted = true; video.playsInline = true;
    video.style.cssText = "width:150px;height:150px";
    document.body.appendChild(video);
    const client = new RealtimeVideoClient(RealtimeVideoClient.urlFor(location));
    const player = new MsePlayer(video, { reportMs: cfg.reportMs, record: false }).attach(client);
    const out = { updates: [], stalls: 0, stallAt: [], leads: [], serverLeads: [], errors: [], frameClock: player.frameClock };
    let playing = false, stopping = false, firstChunk = null;
    video.addEventListener("playing", () => { playing = true; });
    video.addEventListener("waiting", () => {
      if (!playing || stopping) return;
      out.stalls += 1; // when (s after the first chunk) and the player's lead as it stalled
      out.stallAt.push([(performance.now() - firstChunk) / 1e3, player.lead]);
    });
    const arrived = new Map();
    // the WebRTC view (cfg.webrtc): every chunk's arrival here and every frame that view presents
    const rtc = { chunks: [], frames: [], fps: null, error: null };
    client.on("chunk", ({ meta }) => {
      if (!meta || meta.kind !== "media") return;
      if (firstChunk === null) firstChunk = performance.now();
      if (cfg.webrtc) rtc.chunks.push([performance.now(), meta.num_frames, meta.started_event_ids || []]);
      if (typeof meta.playback_lead_seconds === "number") out.serverLeads.push(meta.playback_lead_seconds);
      for (const id of meta.started_event_ids || []) {
        const r = client.interactions.get(id);
        if (r && !arrived.has(id)) arrived.set(id, performance.now() - r.sentAt);
      }
    });
    client.on("error", m => out.errors.push(m.code));
    const done = new Promise(r => client.on("done", r));
    await client.connect();
    client.start(`on-screen benchmark session ${index}`, { width: 256, height: 256, seed: index + 1, watchable: cfg.webrtc || null });
    let pc = null;
    if (cfg.webrtc) { // a second view of the same session: a WHEP viewer (docs/protocol.md §9.5) with its watch token
      while (!client.watchToken && !out.errors.length) await sleep(10);
      out.webrtc = rtc;
      try { pc = await whep(client.watchToken, rtc); } catch (e) { rtc.error = String(e); }
    }
    while (firstChunk === null) await sleep(20);
    const sampler = setInterval(() => { if (playing && !stopping) out.leads.push(player.lead); }, 100);
    const end = performance.now() + cfg.seconds * 1000;
    let n = 0;
    while (true) {
      const gap = cfg.gap * 1000 * (0.6 + 0.8 * Math.random());
      if (performance.now() + gap > end) break;
      await sleep(gap);
      client.interact(`update ${n} of session ${index}`, { eventId: `s${index}-u${n}` }).catch(() => {});
      n += 1;
    }
    await sleep(1500); // the last update reaches the screen
    stopping = true;
    rtc.fps = client.config && client.config.fps;
    if (pc) pc.close();
    clearInterval(sampler);
    client.stop();
    await Promise.race([done, sleep(15000)]);
    for (const r of client.interactions.values()) {
      out.updates.push({ id: r.eventId, sent: r.sentAt, ack: r.ackMs, arrived: arrived.get(r.eventId) ?? null, shown: r.shownMs ?? null, end: r.end });
    }
    client.close();
    return out;
  };
  const all = await Promise.all([...Array(cfg.sessions).keys()].map(one));
  document.body.innerHTML = "";
  return JSON.stringify(all);
})
"""


class Chromium:
    """Headless Chromium with one page, driven over the DevTools protocol."""

    def __init__(self, url: str) -> None:
        path = shutil.which("chromium") or shutil.which("chromium-browser")
        if not path:
            raise SystemExit("Chromium is needed (Debian: apt-get install chromium; scripts/test.sh installs it)")
        self._profile = tempfile.TemporaryDirectory(ignore_cleanup_errors=True)
        self._proc = subprocess.Popen(
            [
                path,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-background-timer-throttling",
                "--disable-renderer-backgrounding",
                "--disable-backgrounding-occluded-windows",
                "--autoplay-policy=no-user-gesture-required",
                "--remote-debugging-port=0",
                "--window-size=1280,800",
                f"--user-data-dir={self._profile.name}",
                url,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        port_file = Path(self._profile.name) / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        page = None
        while page is None and time.monotonic() < deadline:
            time.sleep(0.2)
            if not port_file.exists() or not port_file.read_text().strip():
                continue
            port = port_file.read_text().split()[0]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5) as response:
                    pages = [t for t in json.load(response) if t.get("type") == "page"]
            except OSError:
                continue
            page = next((p for p in pages if p.get("url", "").startswith(url)), None)
        if page is None:
            self.close()
            raise RuntimeError("Chromium did not open the page")
        self._stack = contextlib.ExitStack()
        self._cdp = self._stack.enter_context(connect(page["webSocketDebuggerUrl"], max_size=None))
        self._n = 0
        self.url = url
        while time.monotonic() < deadline:  # the page is loaded (not the blank one before it)
            if self.evaluate("location.href + ' ' + document.readyState", 10) == f"{url} complete":
                break
            time.sleep(0.2)

    def evaluate(self, expression: str, timeout: float) -> Any:
        self._n += 1
        params = {"expression": expression, "awaitPromise": True, "returnByValue": True}
        self._cdp.send(json.dumps({"id": self._n, "method": "Runtime.evaluate", "params": params}))
        while (reply := json.loads(self._cdp.recv(timeout)))["id"] != self._n:
            pass
        result = reply["result"]
        if "exceptionDetails" in result:
            raise RuntimeError(f"the page failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def close(self) -> None:
        if getattr(self, "_stack", None) is not None:
            self._stack.close()
        self._proc.terminate()
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._profile.cleanup()


def run(
    browser: Chromium, sessions: int, report_ms: int, seconds: float, gap: float, webrtc: bool = False
) -> list[dict[str, Any]]:
    cfg = {
        "base": browser.url,
        "sessions": sessions,
        "reportMs": report_ms,
        "seconds": seconds,
        "gap": gap,
        "webrtc": webrtc,
    }
    text = browser.evaluate(f"({PAGE_RUN})({json.dumps(cfg)})", timeout=seconds + 120)
    return json.loads(text)


RTP_CLOCK = 90_000


def webrtc_shown(
    view: dict[str, Any], sent: dict[str, float], tolerance_ms: float = 50.0
) -> tuple[dict[str, float], list[float]]:
    """Send → on screen over WebRTC for the updates of one session (milliseconds, by event id),
    and each chunk's arrival at the page → its first frame on the WebRTC view (milliseconds).

    `view`: `chunks` [[arrival ms, num_frames, started_event_ids], …] in order (the owner's
    WebSocket, same page clock), `frames` [[expected display ms, RTP timestamp], …] as presented,
    `fps`. A WHEP viewer joins at a chunk's first frame (an IDR, docs/protocol.md §9.5), on an RTP
    clock with a random origin, so the chunk it joined at is inferred: the last chunk that reached
    the page before the first frame was presented (+ `tolerance_ms`). That holds while the view's
    delay is under one chunk (0.56 s here), which the printed arrival → frame figures show. A
    chunk whose frames were all skipped by the view gives its updates no figure."""
    frames, chunks, fps = view.get("frames") or [], view.get("chunks") or [], view.get("fps")
    if not frames or not chunks or not fps:
        return {}, []
    first_shown, first_rtp = frames[0]
    offsets = [((rtp - first_rtp) % 2**32) / RTP_CLOCK for _, rtp in frames]  # media seconds since the join
    join = max((j for j, (at, _, _) in enumerate(chunks) if at <= first_shown + tolerance_ms), default=0)
    shown: dict[str, float] = {}
    lags: list[float] = []
    start = 0.0  # media seconds of chunk j after the joined chunk's start
    half = 0.5 / fps
    for at, num_frames, started in chunks[join:]:
        k = bisect.bisect_left(offsets, start - half)
        if k < len(offsets) and offsets[k] < start + num_frames / fps - half:
            lags.append(frames[k][0] - at)
            for event_id in started:
                if event_id in sent:
                    shown[event_id] = frames[k][0] - sent[event_id]
        start += num_frames / fps
    return shown, lags


def summarize_webrtc(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The WebRTC views' figures over the same updates (seconds), beside `summarize`'s MSE ones."""
    shown: list[float] = []
    lags: list[float] = []
    errors: list[str] = []
    updates = 0
    for r in results:
        view = r.get("webrtc")
        if view is None:
            continue
        if view.get("error"):
            errors.append(view["error"])
        updates += len(r["updates"])
        by_id, chunk_lags = webrtc_shown(view, {u["id"]: u["sent"] for u in r["updates"] if u.get("sent") is not None})
        shown += [v / 1e3 for v in by_id.values()]
        lags += [v / 1e3 for v in chunk_lags]
    return {
        "updates": updates,
        "shown": len(shown),
        "p50": percentile(shown, 0.5),
        "p99": percentile(shown, 0.99),
        "arrival_to_frame_p50": percentile(lags, 0.5),
        "arrival_to_frame_p99": percentile(lags, 0.99),
        # a frame shown well before its chunk reached the page: the join chunk was taken one too late
        "early": sum(1 for lag in lags if lag < -0.05),
        "errors": sorted(set(errors)),
    }


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    shown = [u["shown"] / 1e3 for r in results for u in r["updates"] if u["shown"] is not None]
    arrived = [u["arrived"] / 1e3 for r in results for u in r["updates"] if u["arrived"] is not None]
    buffered = [
        (u["shown"] - u["arrived"]) / 1e3
        for r in results
        for u in r["updates"]
        if u["shown"] is not None and u["arrived"] is not None
    ]
    leads = [lead for r in results for lead in r["leads"]]
    server = [lead for r in results for lead in r["serverLeads"]]
    return {
        "updates": sum(len(r["updates"]) for r in results),
        "shown": len(shown),
        "p50": percentile(shown, 0.5),
        "p99": percentile(shown, 0.99),
        "arrived_p50": percentile(arrived, 0.5),
        "buffer_p50": percentile(buffered, 0.5),
        "stalls": sum(r["stalls"] for r in results),
        "stall_at": sorted(tuple(at) for r in results for at in r.get("stallAt", [])),
        "lead": (percentile(leads, 0.1), percentile(leads, 0.5), percentile(leads, 0.9)),
        "server_lead_p50": percentile(server, 0.5) if server else None,
        "errors": sorted({code for r in results for code in r["errors"]}),
        "clock": sorted({r["frameClock"] for r in results}),
    }


def model_counters(url: str) -> dict[str, float]:
    """The model's chunk counters from Triton's /metrics, summed over their labels."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    totals: dict[str, float] = {}
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in (
            "rtvideo_chunks_total",
            "rtvideo_chunk_generate_seconds_total",
            "rtvideo_chunk_encode_seconds_total",
        ):
            totals[name] = totals.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return totals


def per_chunk(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Mean generation and encode seconds per chunk over one run."""
    chunks = after.get("rtvideo_chunks_total", 0.0) - before.get("rtvideo_chunks_total", 0.0)
    if chunks <= 0:
        return {"chunks": 0.0, "generate": float("nan"), "encode": float("nan")}
    return {
        "chunks": chunks,
        "generate": (after["rtvideo_chunk_generate_seconds_total"] - before["rtvideo_chunk_generate_seconds_total"])
        / chunks,
        "encode": (after["rtvideo_chunk_encode_seconds_total"] - before["rtvideo_chunk_encode_seconds_total"]) / chunks,
    }


def per_chunk_rounds(rounds: list[tuple[dict[str, float], dict[str, float]]]) -> dict[str, float]:
    """`per_chunk` over several rounds of one configuration."""
    before: dict[str, float] = {}
    after: dict[str, float] = {}
    for start, end in rounds:
        for key in end:
            before[key] = before.get(key, 0.0) + start.get(key, 0.0)
            after[key] = after.get(key, 0.0) + end[key]
    return per_chunk(before, after)


def stage_line(count: int, name: str, summary: dict[str, Any]) -> str:
    """send → shown split into: boundary wait + waiting for a render worker + transport (what is
    left of send → arrived), generation, encode (the model's means per chunk), and the time the
    chunk waited in the player's buffer (arrived → shown)."""
    model = summary["model"]
    rest = summary["arrived_p50"] - model["generate"] - model["encode"]
    return (
        f"{count:>8} {name:>9}  boundary wait + queue + transport {rest:6.3f}  generation {model['generate']:6.3f}  "
        f"encode {model['encode']:6.3f}  client buffer {summary['buffer_p50']:6.3f}  = shown p50 {summary['p50']:6.3f}"
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", default="1,8,16", help="session counts, comma-separated")
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds of updates per run")
    parser.add_argument("--gap", type=float, default=1.0, help="mean seconds between a session's updates")
    parser.add_argument(
        "--rounds", type=int, default=2, help="alternate the configurations this many times per count (load drifts)"
    )
    parser.add_argument(
        "--configs", default=",".join(CONFIGS), help=f"pacing configurations, comma-separated, of {', '.join(CONFIGS)}"
    )
    parser.add_argument(
        "--no-webrtc", dest="webrtc", action="store_false", help="MSE views only (no WHEP view of each session)"
    )
    parser.add_argument("--json", action="store_true", help="also print every summary as one JSON line")
    args = parser.parse_args(argv)
    args.counts = [int(c) for c in args.counts.split(",")]
    args.configs = [c for c in args.configs.split(",") if c]
    if not args.counts or min(args.counts) < 1:
        parser.error("--counts: positive session counts")
    if not args.configs or any(c not in CONFIGS for c in args.configs):
        parser.error(f"--configs: some of {', '.join(CONFIGS)}")
    if args.rounds < 1 or args.seconds <= 0 or args.gap <= 0:
        parser.error("--rounds, --seconds and --gap must be positive")
    return args


def ratio(a: float, b: float) -> float:
    """a / b, nan where either is missing or b is 0."""
    return a / b if b and not math.isnan(a) and not math.isnan(b) else float("nan")


def main() -> None:
    args = parse_args()
    counts, configs = args.counts, {name: CONFIGS[name] for name in args.configs}
    params = {"max_sessions": str(max(16, max(counts)))}
    with bench_triton({MODEL: params}) as server, ProxyProcess(server.grpc_url, MODEL) as proxy:
        page = proxy.url.replace("ws://", "http://").split("/v1/")[0] + "/"
        print(f"tritonserver ready in {server.startup_seconds:.1f} s; 256x256, 9 frames a chunk at 16 fps")
        if args.webrtc:
            print(
                "each session is watched twice in the same page: its owner's MSE player (rtvideo.js) and a "
                "WHEP viewer (Chromium's WebRTC) with its watch token; the same updates timed on both"
            )
        browser = Chromium(page)
        try:
            run(browser, 1, CONFIGS["playhead"], 3.0, 1.0, args.webrtc)  # warm-up: codecs, render workers
            header = (
                f"{'sessions':>8} {'pacing':>9} {'view':>6} {'updates':>8} {'p50 s':>7} {'p99 s':>7} "
                f"{'arrive p50':>10} {'buffer p50':>10} {'stalls':>6} {'lead p10/p50/p90 s':>20} {'server lead':>11}"
            )
            print(header)
            rows: list[dict[str, Any]] = []
            stages: list[str] = []
            ratios: list[str] = []
            for count in counts:
                pair: dict[str, Any] = {}
                measured: dict[str, list[dict[str, Any]]] = {name: [] for name in configs}
                counters: dict[str, list[tuple[dict[str, float], dict[str, float]]]] = {n: [] for n in configs}
                for _ in range(args.rounds):  # alternating, so both see the machine's load alike
                    for name, report_ms in configs.items():
                        before = model_counters(server.metrics_url)
                        measured[name] += run(
                            browser, count, report_ms, args.seconds / args.rounds, args.gap, args.webrtc
                        )
                        counters[name].append((before, model_counters(server.metrics_url)))
                for name in configs:
                    summary = summarize(measured[name])
                    summary["model"] = per_chunk_rounds(counters[name])
                    pair[name] = summary
                    stages.append(stage_line(count, name, summary))
                    lead = "/".join(f"{v:.2f}" for v in summary["lead"])
                    server_lead = "-" if summary["server_lead_p50"] is None else f"{summary['server_lead_p50']:.2f}"
                    print(
                        f"{count:>8} {name:>9} {'mse':>6} {summary['shown']:>4}/{summary['updates']:<3} "
                        f"{summary['p50']:7.3f} {summary['p99']:7.3f} {summary['arrived_p50']:10.3f} "
                        f"{summary['buffer_p50']:10.3f} {summary['stalls']:>6} {lead:>20} {server_lead:>11}"
                        + (f"  errors: {summary['errors']}" if summary["errors"] else ""),
                        flush=True,
                    )
                    if summary["stall_at"]:  # when they came: the start (before measured chunk times) or later
                        early = sum(1 for at, _ in summary["stall_at"] if at < 3.0)
                        # a `waiting` with media buffered is the decoder or page falling behind (or the
                        # event handled late, after the next append), not an empty buffer
                        with_data = sum(1 for _, lead in summary["stall_at"] if lead >= 0.1)
                        where = " ".join(f"{at:.1f}s/{lead:.2f}" for at, lead in summary["stall_at"][:12])
                        print(
                            f"{'':>25} stalls in the first 3 s: {early}; with >= 0.1 s buffered: {with_data}; "
                            f"at (s after first chunk / lead): {where}"
                        )
                    if args.webrtc:
                        rtc = summarize_webrtc(measured[name])
                        summary["webrtc"] = rtc
                        print(
                            f"{count:>8} {name:>9} {'webrtc':>6} {rtc['shown']:>4}/{rtc['updates']:<3} "
                            f"{rtc['p50']:7.3f} {rtc['p99']:7.3f}  chunk arrival → its first WebRTC frame "
                            f"p50 {rtc['arrival_to_frame_p50']:.3f} p99 {rtc['arrival_to_frame_p99']:.3f}"
                            + (f", {rtc['early']} before it (a join misread)" if rtc["early"] else "")
                            + (f"  errors: {rtc['errors']}" if rtc["errors"] else ""),
                            flush=True,
                        )
                        ratios.append(
                            f"{count:>8} {name:>9} MSE / WebRTC: p50 {ratio(summary['p50'], rtc['p50']):.2f}x "
                            f"p99 {ratio(summary['p99'], rtc['p99']):.2f}x"
                        )
                        print(ratios[-1], flush=True)
                if "fixed" in pair and "playhead" in pair:
                    r = ratio(pair["fixed"]["p50"], pair["playhead"]["p50"])
                    print(f"{count:>8} {'ratio':>9} fixed p50 / playhead p50 = {r:.2f}x", flush=True)
                rows.append({"sessions": count, **pair})
            print(f"frame clock: {sorted({c for r in rows for n in configs for c in r[n]['clock']})}")
            print("where the time goes (p50 of each update, seconds):")
            print("\n".join(stages))
            if ratios:
                print("prompt update → picture, MSE over WebRTC, same sessions and updates:")
                print("\n".join(ratios))
            if args.json:
                print(json.dumps(rows))
        finally:
            browser.close()


if __name__ == "__main__":
    main()
