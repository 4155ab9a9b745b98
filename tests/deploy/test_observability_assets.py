"""The Grafana dashboard and the Prometheus alert rules (deploy/grafana, deploy/prometheus)
against what a real proxy and a real Triton export: every metric they name is scraped from
the running stack (the session's Triton, a proxy in front of it), every histogram bucket they
name is one it has, the realtime alert fires on a machine loaded past real time, and the store
alert when a proxy's real Redis is killed (docs/operations.md, "Dashboard and alerts")."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import Histogram

from rtvideo.proxy.observability.metrics import DECLARED, ProxyMetrics
from tests.support.promql import Evaluator, Node, exported_names, metric_names, parse, scrape_series
from tests.support.proxy_client import NO_KEEPALIVE, Ws, ws
from tests.support.proxy_host import run, wait_idle
from tests.support.redis_server import serve_redis
from tests.support.streams import FAST_MODEL, PACED_MODEL

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "rtvideo-dashboard.json"
ALERTS = ROOT / "deploy" / "prometheus" / "rtvideo-alerts.yaml"
#: series Prometheus makes itself (not exported by any target)
SYNTHETIC = {"up"}


def rules() -> dict[str, dict[str, Any]]:
    doc = yaml.safe_load(ALERTS.read_text())
    return {rule["alert"]: rule for group in doc["groups"] for rule in group["rules"]}


def dashboard_expressions() -> list[str]:
    doc = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in doc["panels"] for target in panel["targets"]]


def test_the_assets_are_well_formed() -> None:
    alerts = rules()
    wanted = {
        "RtvideoRealtimeFactorBelowOne",
        "RtvideoPlaybackUnderruns",
        "RtvideoFirstChunkOverBudget",
        "RtvideoTritonEndpointDown",
        "RtvideoScrapeTargetDown",
        "RtvideoSessionsRefusedForCapacity",
        "RtvideoSessionStoreUnreachable",
        "RtvideoSessionStoreRefusingWrites",
        "RtvideoSlowTakeovers",
    }
    assert wanted <= set(alerts)
    for name, rule in alerts.items():
        parse(rule["expr"])  # the reader below understands every expression
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        assert rule["annotations"]["summary"], name
    doc = json.loads(DASHBOARD.read_text())
    assert doc["uid"] == "rtvideo" and len({p["id"] for p in doc["panels"]}) == len(doc["panels"])
    for expression in dashboard_expressions():
        parse(expression)


def scrape(url: str) -> str:
    return urllib.request.urlopen(url, timeout=10).read().decode()


def selectors(node: Node) -> Iterator[Node]:
    if node.kind == "sel":
        yield node
    for arg in node.args:
        yield from selectors(arg)


def every_proxy_histogram_observed() -> str:
    """A proxy's exposition with one observation in each histogram (labelled ones too), so that
    each shows its buckets: those a scrape of a quiet proxy would not (no takeover happened)."""
    metrics = ProxyMetrics(recordings=True)
    for spec in DECLARED:
        if spec.kind is Histogram:
            histogram = getattr(metrics, spec.name.removeprefix("rtvideo_proxy_").removeprefix("rtvideo_"))
            (histogram.labels(*("x" for _ in spec.labels)) if spec.labels else histogram).observe(0.5)
    return metrics.render()


def test_every_metric_the_dashboard_and_the_rules_name_is_exported(proxies, triton) -> None:
    """A session with an update and playhead reports, then both /metrics: each name the assets
    select is a sample (or a declared sample) of the proxy's or the model's exposition."""
    server = proxies.server(model=PACED_MODEL)

    async def body() -> None:
        async with ws(server.url, **NO_KEEPALIVE) as conn:
            s = Ws(conn)
            await s.start("a quay", seed=4)  # unbounded: stopped below
            await s.next_media()
            await s.interact("rain", "e1", transition_chunks=0)
            for position in (0.0, 0.3, 0.6, 0.9, 1.2):
                await s.send({"type": "session.playback", "position_seconds": position})
                await asyncio.sleep(0.3)
            await s.send({"type": "session.stop"})
            await s.until(lambda m: m["type"] == "session.done", 60)

    run(body())
    time.sleep(1.5)  # the model flushes its metrics once a second
    exported = exported_names(scrape(f"http://127.0.0.1:{server.port}/metrics"), scrape(triton.metrics_url))
    expressions = dashboard_expressions() + [rule["expr"] for rule in rules().values()]
    named = metric_names(expressions)
    assert named - SYNTHETIC - exported == set()
    assert len(named) > 15
    # a bucket named by its bound (le="5.0") is one the histogram has, written as its exporter writes it
    series = scrape_series(scrape(triton.metrics_url), every_proxy_histogram_observed())
    bounds = {name: {dict(labels)["le"] for labels in v} for name, v in series.items() if name.endswith("_bucket")}
    le = [(s.name, m[2]) for e in expressions for s in selectors(parse(e)) for m in s.matchers if m[:2] == ("le", "=")]
    assert len(le) >= 3
    for name, bound in le:
        assert bound in bounds.get(name, set()), (name, bound, sorted(bounds.get(name, ())))


def test_a_machine_loaded_past_real_time_raises_the_realtime_alert(proxies, triton) -> None:
    """Four unpaced sessions at 1280x1280 and 60 fps at once on the built-in generator (the CPU
    model of the tests): each chunk takes longer to make than to play, so the realtime factor's
    share of chunks at or below 1 passes the rule's threshold and its expression returns the
    model. A light session alone (256x256, 16 fps) does not. Evaluated with the rule's own
    expression over the span between two scrapes of Triton's /metrics."""
    url = proxies.url()  # the unpaced model: generation runs as fast as it can
    expression = rules()["RtvideoRealtimeFactorBelowOne"]["expr"]

    async def session(size: int, fps: int, frames: int) -> None:
        async with ws(url, **NO_KEEPALIVE) as conn:
            s = Ws(conn)
            await s.start("a crowded market", width=size, height=size, fps=fps, num_frames=frames, seed=9)
            await s.until(lambda m: m["type"] == "session.done", 240)

    def window(*sessions: tuple[int, int, int]) -> dict:
        wait_idle(triton)
        time.sleep(1.5)  # every earlier chunk flushed
        before, began = scrape_series(scrape(triton.metrics_url)), time.monotonic()

        async def all_of() -> None:
            await asyncio.gather(*(session(*args) for args in sessions))

        run(all_of(), timeout=300)
        time.sleep(1.5)
        after = scrape_series(scrape(triton.metrics_url))
        fired = Evaluator(before, after, time.monotonic() - began)(expression)
        return {dict(labels).get("model"): value for labels, value in fired.items()}

    light = window((256, 16, 36))
    assert FAST_MODEL not in light, light
    loaded = window(*[(1280, 60, 36)] * 4)
    print(f"share of chunks at or below real time: light {light}, loaded {loaded}")
    assert FAST_MODEL in loaded, loaded
    assert 0.5 < loaded[FAST_MODEL] <= 1.0


def test_a_killed_session_store_raises_its_alert_and_sessions_go_on(proxies, triton, tmp_path: Path) -> None:
    """A proxy keeping its sessions in a real Redis (`--session-store`), one session streaming.
    The Redis is killed (kill -9): the session's next store call fails, and the store alert's
    expression over two scrapes of the proxy's /metrics returns that proxy. The session goes on:
    an update sent after the kill is refused `store_unavailable` (never acked before a takeover
    could read it: docs/decisions.md "The session store under faults") and media keep coming; a
    new session that is not resumable starts and streams without the store, its update acked
    and started by a chunk. Before the kill the expression returns nothing."""
    expression = rules()["RtvideoSessionStoreUnreachable"]["expr"]
    wait_idle(triton, PACED_MODEL)
    with serve_redis(tmp_path) as redis:
        server = proxies.server(model=PACED_MODEL, session_store=redis.url)
        metrics_url = f"http://127.0.0.1:{server.port}/metrics"

        def fired(before: dict, after: dict) -> dict:
            return Evaluator(before, after, 60.0)(expression)

        async def errors_counted(deadline: float) -> dict:
            while time.monotonic() < deadline:
                after = scrape_series(await asyncio.to_thread(scrape, metrics_url))
                if after.get("rtvideo_proxy_store_errors_total"):
                    return after
                await asyncio.sleep(0.2)
            raise AssertionError("no store error counted after the store was killed")

        async def body() -> tuple[dict, dict, dict]:
            async with ws(server.url, **NO_KEEPALIVE) as conn:
                s = Ws(conn)
                start = await s.start("a harbour at night", seed=6)  # unbounded: stopped below
                assert "resume_token" in start  # a shared store: resumable without asking
                await s.next_media()
                before = scrape_series(await asyncio.to_thread(scrape, metrics_url))
                quiet = fired(before, scrape_series(await asyncio.to_thread(scrape, metrics_url)))
                assert redis.proc is not None
                redis.proc.kill()
                redis.proc.wait()
                after = await errors_counted(time.monotonic() + 60)
                await s.interact("the harbour in fog", "e1", transition_chunks=0)
                refused = await s.until(lambda m: m.get("event_id") == "e1", 60)
                assert refused["type"] == "error" and refused["code"] == "store_unavailable", refused
                await s.next_media()
                await s.send({"type": "session.stop"})
                await s.until("session.done", 60)
            async with ws(server.url, **NO_KEEPALIVE) as conn:
                s = Ws(conn)
                await s.start("a new session, no store", seed=7, resumable=False)
                await s.next_media()
                await s.interact("the harbour in fog", "e2", transition_chunks=0)
                await s.until(lambda m: m["type"] == "session.interaction.queued" and m["event_id"] == "e2", 60)
                await s.until(lambda m: "e2" in m.get("started_event_ids", []), 60)  # applied
                await s.send({"type": "session.stop"})
                await s.until("session.done", 60)
            return before, after, quiet

        before, after, quiet = run(body(), timeout=240)
    assert quiet == {}
    assert list(fired(before, after).values()) and all(v > 0 for v in fired(before, after).values())
