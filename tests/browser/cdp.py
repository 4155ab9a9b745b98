"""Several pages in one headless Chromium, driven over the DevTools protocol: what the
participant tests need (an owner's, a watcher's and a steerer's page of one session at once).

`tests.support.browser.drive_page` drives one page to its end; here each page stays open
while the test acts on the others. Pages are separate windows, never throttled as background
tabs would be (a watcher's video must play while the owner's page is in front).
"""

from __future__ import annotations

import base64
import json
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path
from typing import Any

from websockets.sync.client import ClientConnection, connect

from tests.support.browser import HEADLESS_FLAGS, chromium
from tests.support.processes import terminate

#: JavaScript: the video element's state, and how much of its picture is not black (pixels
#: sampled through a canvas: the mean level and the share of pixels brighter than 24 of 255)
PICTURE = """(() => {
  const v = document.getElementById('video');
  const out = {time: v.currentTime, ready: v.readyState, paused: v.paused, width: v.videoWidth, mean: 0, lit: 0};
  if (v.videoWidth) {
    const c = document.createElement('canvas');
    c.width = 64; c.height = 64;
    const g = c.getContext('2d', {willReadFrequently: true});
    g.drawImage(v, 0, 0, 64, 64);
    const d = g.getImageData(0, 0, 64, 64).data;
    let sum = 0, lit = 0;
    for (let i = 0; i < d.length; i += 4) {
      const level = (d[i] + d[i + 1] + d[i + 2]) / 3;
      sum += level; lit += level > 24;
    }
    out.mean = sum / (d.length / 4); out.lit = lit / (d.length / 4);
  }
  return JSON.stringify(out);
})()"""

#: JavaScript: what overflows at the current width: the page scrolling sideways, elements that
#: reach past the viewport, and text cut by its box (overflow hidden or an ellipsis)
OVERFLOW = """(() => {
  const width = document.documentElement.clientWidth;
  const name = el => el.id ? '#' + el.id : el.tagName.toLowerCase() + (el.className && typeof el.className === 'string' ? '.' + el.className.split(' ')[0] : '');
  const out = {width, scroll: document.documentElement.scrollWidth, past: [], clipped: []};
  for (const el of document.querySelectorAll('body *')) {
    const style = getComputedStyle(el);
    if (style.display === 'none' || style.visibility === 'hidden' || el.closest('[hidden]')) continue;
    const rect = el.getBoundingClientRect();
    if (!rect.width || !rect.height) continue;
    if (rect.right > width + 1) out.past.push(name(el) + ' right=' + Math.round(rect.right));
    const cuts = style.overflowX === 'hidden' || style.overflowX === 'clip' || style.textOverflow === 'ellipsis';
    if (cuts && el.scrollWidth > el.clientWidth + 1 && el.tagName !== 'VIDEO') out.clipped.push(name(el) + ' ' + el.scrollWidth + '>' + el.clientWidth);
  }
  return JSON.stringify(out);
})()"""


#: what DevTools answers to an evaluation that a navigation interrupted or ran before
_NAVIGATED = ("Inspected target navigated or closed", "Execution context was destroyed", "Cannot find context")


class Navigated(Exception):
    """The page navigated while (or before) an evaluation ran in it: its old document is gone."""


class Page:
    """One open page: evaluate JavaScript in it, wait for a condition, take its picture."""

    def __init__(self, conn: ClientConnection) -> None:
        self._conn = conn
        self._next = 0

    def call(self, method: str, params: dict[str, Any] | None = None, timeout: float = 60.0) -> dict[str, Any]:
        self._next += 1
        self._conn.send(json.dumps({"id": self._next, "method": method, "params": params or {}}))
        deadline = time.monotonic() + timeout
        while True:
            reply = json.loads(self._conn.recv(max(0.1, deadline - time.monotonic())))
            if reply.get("id") == self._next:
                message = str(reply.get("error", {}).get("message", ""))
                if any(gone in message for gone in _NAVIGATED):
                    raise Navigated(message)
                assert "error" not in reply, reply
                return reply["result"]

    def eval(self, expression: str, timeout: float = 60.0) -> Any:
        """The value of `expression` (a promise is awaited; JSON-able values only)."""
        found = self.call(
            "Runtime.evaluate", {"expression": expression, "awaitPromise": True, "returnByValue": True}, timeout
        )
        assert "exceptionDetails" not in found, found["exceptionDetails"]
        return found["result"].get("value")

    def leave_by(self, expression: str) -> None:
        """Evaluate `expression`, which starts a navigation (a link clicked): the answer may be
        that the page navigated before it came, which is what was asked. `wait` for the new page."""
        with suppress(Navigated):
            self.eval(expression)

    def wait(self, expression: str, timeout: float = 60.0, every: float = 0.25) -> Any:
        """Poll `expression` until it is truthy; returns its value (AssertionError after `timeout`)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                value = self.eval(expression)
            except Navigated:  # a page that navigates (a link clicked) has no answer until it loads
                value = None
            if value:
                return value
            assert time.monotonic() < deadline, f"not within {timeout} s: {expression}"
            time.sleep(every)

    def picture(self) -> dict[str, Any]:
        return json.loads(self.eval(PICTURE))

    def overflow(self) -> dict[str, Any]:
        return json.loads(self.eval(OVERFLOW))

    def size(self, width: int, height: int = 800) -> None:
        self.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )
        time.sleep(0.3)  # the layout settles

    def screenshot(self, path: Path, full: bool = False) -> Path:
        """A PNG of the viewport (`full`: the whole page, as tall as it is)."""
        params: dict[str, Any] = {"format": "png"}
        if full:
            params["captureBeyondViewport"] = True
            metrics = self.call("Page.getLayoutMetrics")
            size = metrics["cssContentSize"]
            params["clip"] = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
        shot = self.call("Page.captureScreenshot", params)
        path.write_bytes(base64.b64decode(shot["data"]))
        return path


class Browser:
    """One Chromium; `open` makes a new window on a URL."""

    def __init__(self, port: int, browser_path: str, stack: ExitStack) -> None:
        self.port = port
        self._stack = stack  # every DevTools connection, closed with the browser
        self._browser = stack.enter_context(connect(f"ws://127.0.0.1:{port}{browser_path}", max_size=None))
        self._next = 0
        self.pages: list[Page] = []

    def _call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        self._next += 1
        self._browser.send(json.dumps({"id": self._next, "method": method, "params": params}))
        while True:
            reply = json.loads(self._browser.recv(30))
            if reply.get("id") == self._next:
                assert "error" not in reply, reply
                return reply["result"]

    def open(self, url: str, width: int = 1280, height: int = 800) -> Page:
        target = self._call("Target.createTarget", {"url": url, "newWindow": True, "width": width, "height": height})
        conn = self._stack.enter_context(
            connect(f"ws://127.0.0.1:{self.port}/devtools/page/{target['targetId']}", max_size=None)
        )
        page = Page(conn)
        page.size(width, height)
        self.pages.append(page)
        return page


@contextmanager
def browser() -> Iterator[Browser]:
    """A headless Chromium with no page of its own (open pages with `Browser.open`)."""
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as profile:
        process = subprocess.Popen(
            [
                chromium(),
                *HEADLESS_FLAGS,
                # several windows at once: none is throttled for being in the background
                "--disable-background-timer-throttling",
                "--disable-renderer-backgrounding",
                "--disable-backgrounding-occluded-windows",
                f"--user-data-dir={profile}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        stack = ExitStack()
        try:
            port_file = Path(profile) / "DevToolsActivePort"
            deadline = time.monotonic() + 60
            while not (port_file.exists() and len(port_file.read_text().split()) == 2):
                assert time.monotonic() < deadline, "Chromium did not start"
                time.sleep(0.1)
            port, path = port_file.read_text().split()
            with stack:
                yield Browser(int(port), path, stack)
        finally:
            terminate(process)
