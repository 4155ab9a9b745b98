"""On-screen interaction latency: how long a prompt update takes to show in a real browser, with
the fixed-lead pacing and with pacing to the players' `session.playback` reports, side by side
in the same run. Prints figures; asserts nothing.

    .venv/bin/python benchmarks/bench_onscreen.py [--counts 1,8,16] [--seconds 20]

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
both alike; their figures are pooled per configuration.
"""

from __future__ import annotations

import argparse
import contextlib
import json
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
    client.on("chunk", ({ meta }) => {
      if (!meta || meta.kind !== "media") return;
      if (firstChunk === null) firstChunk = performance.now();
      if (typeof meta.playback_lead_seconds === "number") out.serverLeads.push(meta.playback_lead_seconds);
      for (const id of meta.started_event_ids || []) {
        const r = client.interactions.get(id);
        if (r && !arrived.has(id)) arrived.set(id, performance.now() - r.sentAt);
      }
    });
    client.on("error", m => out.errors.push(m.code));
    const done = new Promise(r => client.on("done", r));
    await client.connect();
    client.start(`on-screen benchmark session ${index}`, { width: 256, height: 256, seed: index + 1 });
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
    clearInterval(sampler);
    client.stop();
    await Promise.race([done, sleep(15000)]);
    for (const r of client.interactions.values()) {
      out.updates.push({ ack: r.ackMs, arrived: arrived.get(r.eventId) ?? null, shown: r.shownMs ?? null, end: r.end });
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


def run(browser: Chromium, sessions: int, report_ms: int, seconds: float, gap: float) -> list[dict[str, Any]]:
    cfg = {"base": browser.url, "sessions": sessions, "reportMs": report_ms, "seconds": seconds, "gap": gap}
    text = browser.evaluate(f"({PAGE_RUN})({json.dumps(cfg)})", timeout=seconds + 120)
    return json.loads(text)


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", default="1,8,16", help="session counts, comma-separated")
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds of updates per run")
    parser.add_argument("--gap", type=float, default=1.0, help="mean seconds between a session's updates")
    parser.add_argument(
        "--rounds", type=int, default=2, help="alternate the configurations this many times per count (load drifts)"
    )
    parser.add_argument("--json", action="store_true", help="also print every summary as one JSON line")
    args = parser.parse_args()
    counts = [int(c) for c in args.counts.split(",")]
    params = {"max_sessions": str(max(16, max(counts)))}
    with bench_triton({MODEL: params}) as server, ProxyProcess(server.grpc_url, MODEL) as proxy:
        page = proxy.url.replace("ws://", "http://").split("/v1/")[0] + "/"
        print(f"tritonserver ready in {server.startup_seconds:.1f} s; 256x256, 9 frames a chunk at 16 fps")
        browser = Chromium(page)
        try:
            run(browser, 1, CONFIGS["playhead"], 3.0, 1.0)  # warm-up: codecs, render workers
            header = (
                f"{'sessions':>8} {'pacing':>9} {'updates':>8} {'p50 s':>7} {'p99 s':>7} {'arrive p50':>10} "
                f"{'buffer p50':>10} {'stalls':>6} {'lead p10/p50/p90 s':>20} {'server lead':>11}"
            )
            print(header)
            rows: list[dict[str, Any]] = []
            stages: list[str] = []
            for count in counts:
                pair: dict[str, Any] = {}
                measured: dict[str, list[dict[str, Any]]] = {name: [] for name in CONFIGS}
                counters: dict[str, list[tuple[dict[str, float], dict[str, float]]]] = {n: [] for n in CONFIGS}
                for _ in range(args.rounds):  # alternating, so both see the machine's load alike
                    for name, report_ms in CONFIGS.items():
                        before = model_counters(server.metrics_url)
                        measured[name] += run(browser, count, report_ms, args.seconds / args.rounds, args.gap)
                        counters[name].append((before, model_counters(server.metrics_url)))
                for name in CONFIGS:
                    summary = summarize(measured[name])
                    summary["model"] = per_chunk_rounds(counters[name])
                    pair[name] = summary
                    stages.append(stage_line(count, name, summary))
                    lead = "/".join(f"{v:.2f}" for v in summary["lead"])
                    server_lead = "-" if summary["server_lead_p50"] is None else f"{summary['server_lead_p50']:.2f}"
                    print(
                        f"{count:>8} {name:>9} {summary['shown']:>4}/{summary['updates']:<3} {summary['p50']:7.3f} "
                        f"{summary['p99']:7.3f} {summary['arrived_p50']:10.3f} {summary['buffer_p50']:10.3f} "
                        f"{summary['stalls']:>6} {lead:>20} {server_lead:>11}"
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
                            f"{'':>18} stalls in the first 3 s: {early}; with >= 0.1 s buffered: {with_data}; "
                            f"at (s after first chunk / lead): {where}"
                        )
                ratio = pair["fixed"]["p50"] / pair["playhead"]["p50"] if pair["playhead"]["p50"] else float("nan")
                print(f"{count:>8} {'ratio':>9} fixed p50 / playhead p50 = {ratio:.2f}x", flush=True)
                rows.append({"sessions": count, **pair})
            print(f"frame clock: {sorted({c for r in rows for n in CONFIGS for c in r[n]['clock']})}")
            print("where the time goes (p50 of each update, seconds):")
            print("\n".join(stages))
            if args.json:
                print(json.dumps(rows))
        finally:
            browser.close()


if __name__ == "__main__":
    main()
