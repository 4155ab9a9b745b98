"""The demo page at `GET /`, driven by its URL parameters in headless Chromium against a real
proxy and Triton: start, a prompt update mid-stream, stop, all played through MSE."""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urlencode

import pytest
from websockets.sync.client import connect

from tests.streams import PACED_MODEL
from tests.test_browser_mse import chromium
from tests.test_proxy import ProxyHost, wait_idle


@pytest.fixture(scope="module")
def demo_proxy(triton) -> Iterator[Any]:
    host = ProxyHost(triton.grpc_url)
    try:
        yield host.server(model=PACED_MODEL)
    finally:
        host.close()


DONE_TITLE = "rtvideo demo: done"


def run_page(url: str, timeout: float = 30.0) -> tuple[str, str]:
    """Open `url` in headless Chromium in real time (virtual time would run ahead of the
    WebSocket), wait until the page's title says it is done, and return (summary, log) texts."""
    with tempfile.TemporaryDirectory() as profile:
        browser = subprocess.Popen(
            [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--autoplay-policy=no-user-gesture-required", "--remote-debugging-port=0",
             f"--user-data-dir={profile}", url],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + timeout
            port_file = Path(profile) / "DevToolsActivePort"
            page: dict[str, Any] = {}
            while time.monotonic() < deadline:
                time.sleep(0.2)
                if not port_file.exists() or not port_file.read_text().strip():
                    continue
                port = port_file.read_text().split()[0]
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5) as response:
                        pages = [t for t in json.load(response) if t.get("type") == "page"]
                except OSError:
                    continue
                if pages:
                    page = pages[0]
                    if page.get("title") == DONE_TITLE:
                        break
            assert page, "Chromium did not open the page"
            with connect(page["webSocketDebuggerUrl"], max_size=None) as cdp:
                texts = []
                for n, element in enumerate(("summary", "log")):
                    cdp.send(json.dumps({"id": n, "method": "Runtime.evaluate", "params": {
                        "expression": f"document.getElementById({element!r}).innerText"}}))
                    while (reply := json.loads(cdp.recv(10)))["id"] != n:
                        pass
                    texts.append(reply["result"]["result"].get("value", ""))
            return texts[0], texts[1]
        finally:
            browser.terminate()
            try:
                browser.wait(10)
            except subprocess.TimeoutExpired:
                browser.kill()
                browser.wait()


def test_the_page_is_served(demo_proxy) -> None:
    with urllib.request.urlopen(f"http://127.0.0.1:{demo_proxy.port}/", timeout=10) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/html")
        body = response.read().decode()
    assert '<pre id="summary">' in body and "/realtime/video" in body


def test_demo_page_starts_updates_stops_and_plays(demo_proxy, triton) -> None:
    wait_idle(triton, PACED_MODEL)
    query = urlencode({"prompt": "a lighthouse in a storm", "autostart": 1, "update": "a calm sea at noon",
                       "transition_chunks": 2, "update_after": 2, "stop_after": 5})
    text, page_log = run_page(f"http://127.0.0.1:{demo_proxy.port}/?{query}")
    assert text, "the session did not end in time; the page's log:\n" + page_log
    summary = json.loads(text)
    assert summary["errors"] == [], summary
    assert summary["chunks"] >= 5, summary
    assert len(summary["acks"]) == 1 and summary["acks"][0].startswith("demo-"), summary
    done = summary["done"]
    assert done["stopped"] is True and done["chunks"] == summary["payloads"], summary
    assert summary["video_error"] is None, summary
    assert abs(summary["buffered_end"] - summary["frames"] / 16) < 1 / 16, summary
    assert summary["frames"] >= 5 * 9, summary
    ack = summary["acks"][0]
    assert f"started=[{ack}]" in page_log and f"completed=[{ack}]" in page_log, page_log  # it landed mid-stream
