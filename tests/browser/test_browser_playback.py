"""The demo page reports its playhead (`session.playback`, sent by rtvideo.js's MsePlayer) in
headless Chromium against a real proxy and Triton: the proxy receives the reports (never
answering them), the model paces by them (the page shows its view of the lead), and the
timeline shows the update's on-screen latency."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

import pytest

from tests.support.browser import TEXT_OF, drive_page
from tests.support.proxy_host import ProxyHost, wait_idle
from tests.support.streams import PACED_MODEL

#: an element's text; textContent, since the log is folded in a <details>
#: the first timeline row's text once it says "on screen in" (or after 30 s, whatever it says)
SHOWN_ROW = """new Promise(resolve => {
  const began = Date.now();
  const look = () => {
    const li = document.querySelector('#timeline li[data-event-id]');
    const text = li ? li.innerText : '';
    if (text.includes('on screen in') || Date.now() - began > 30000) resolve(text); else setTimeout(look, 100);
  };
  look();
})"""


@pytest.fixture(scope="module")
def paced_proxy(triton) -> Iterator[Any]:
    host = ProxyHost(triton.grpc_url)
    try:
        yield host.server(model=PACED_MODEL, start_timeout=9.0, max_sessions_per_client=2)  # its own metrics
    finally:
        host.close()


def metric_count(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(f"{name}_count"))


def test_the_page_reports_its_playhead_and_shows_on_screen_latency(paced_proxy, triton) -> None:
    wait_idle(triton, PACED_MODEL)
    query = urlencode(
        {"prompt": "a lighthouse in a storm", "autostart": 1, "update": "a calm sea at noon", "update_after": 2}
        | {"transition_chunks": 1, "stop_after": 9}
    )
    found = drive_page(
        f"http://127.0.0.1:{paced_proxy.port}/?{query}",
        {
            "summary": TEXT_OF % "summary",
            "log": TEXT_OF % "log",
            "row": SHOWN_ROW,
            "server_lead": "document.getElementById('m-lead-server').textContent",
        },
        timeout=120,
    )
    assert found["summary"], "the session did not end in time; the page's log:\n" + found["log"]
    summary = json.loads(found["summary"])
    assert summary["errors"] == [] and summary["video_error"] is None, summary  # no report was answered
    assert "on screen in" in found["row"], found
    assert found["server_lead"].startswith("server's view: ") and found["server_lead"].endswith(" s"), found
    assert metric_count(paced_proxy.port, "rtvideo_proxy_reported_lead_seconds") > 0
