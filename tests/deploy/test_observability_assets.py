"""The Grafana dashboard and the Prometheus alert rules (deploy/grafana, deploy/prometheus)
against what a real proxy and a real Triton export: every metric they name is scraped from
the running stack (the session's Triton, a proxy in front of it), and the realtime alert fires
on a machine loaded past real time (docs/operations.md, "Dashboard and alerts")."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from tests.support.promql import Evaluator, exported_names, metric_names, parse, scrape_series
from tests.support.proxy_client import NO_KEEPALIVE, Ws, ws
from tests.support.proxy_host import run, wait_idle
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
    named = metric_names(dashboard_expressions() + [rule["expr"] for rule in rules().values()])
    assert named - SYNTHETIC - exported == set()
    assert len(named) > 15


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
