"""Headless Chromium for the browser tests: where it is installed, and a page driven over the
DevTools protocol until it says it is done."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from websockets.sync.client import connect

from tests.support.processes import terminate

#: the title the demo page (proxy/static/index.html) sets once its session is over
DONE_TITLE = "rtvideo demo: done"
#: an expression for `drive_page`: the text of the page's element with this id (`TEXT_OF % "log"`)
TEXT_OF = "document.getElementById(%r).textContent"
#: an expression for `drive_page`: the timeline's event rows (JSON: id, end, text of each)
TIMELINE_ROWS = (
    "JSON.stringify([...document.querySelectorAll('#timeline li[data-event-id]')].map("
    "li => ({id: li.dataset.eventId, end: li.dataset.end || null, text: li.innerText})))"
)


#: how every test starts Chromium: headless, no network of its own, video that plays by itself,
#: the DevTools port chosen by Chromium (read from its profile)
HEADLESS_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--autoplay-policy=no-user-gesture-required",
    "--remote-debugging-port=0",
    "--hide-scrollbars",
)


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    assert path, "Chromium is needed for this test: scripts/test.sh installs it (Debian package chromium)"
    return path


def drive_page(
    url: str,
    expressions: Mapping[str, str],
    timeout: float = 120.0,
    screenshot: Path | None = None,
    done_title: str | None = DONE_TITLE,
) -> dict[str, Any]:
    """Open `url` in headless Chromium (a 1280x800 window), wait until the page's title is
    `done_title` (None: until the page exists), evaluate `expressions` (name -> JavaScript; a
    promise is awaited) and, if asked, save a PNG screenshot. In real time: the timeout only
    bounds a page that never gets done (a loaded machine takes longer to get there)."""
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as profile:  # Chromium's helpers may linger
        browser = subprocess.Popen(
            [chromium(), *HEADLESS_FLAGS, "--window-size=1280,800", f"--user-data-dir={profile}", url],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
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
                    if done_title is None or page.get("title") == done_title:
                        break
            assert page, "Chromium did not open the page"
            results: dict[str, Any] = {}
            with connect(page["webSocketDebuggerUrl"], max_size=None) as cdp:

                def call(n: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
                    cdp.send(json.dumps({"id": n, "method": method, "params": params}))
                    while (reply := json.loads(cdp.recv(max(10.0, deadline - time.monotonic()))))["id"] != n:
                        pass
                    return reply["result"]

                for n, (name, expression) in enumerate(expressions.items()):
                    found = call(n, "Runtime.evaluate", {"expression": expression, "awaitPromise": True})
                    assert "exceptionDetails" not in found, found["exceptionDetails"]
                    results[name] = found["result"].get("value", "")
                if screenshot is not None:
                    call(
                        len(expressions),
                        "Emulation.setDeviceMetricsOverride",
                        {"width": 1280, "height": 800, "deviceScaleFactor": 1, "mobile": False},
                    )
                    time.sleep(0.5)  # let the last frame and the final layout paint
                    shot = call(len(expressions) + 1, "Page.captureScreenshot", {"format": "png"})
                    screenshot.write_bytes(base64.b64decode(shot["data"]))
            return results
        finally:
            terminate(browser)
