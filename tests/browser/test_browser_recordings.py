"""The recordings page (proxy/static/recordings.html) in a real headless Chromium: it lists a
recording made through the real proxy, plays its video.mp4, and marks its interactions on the
timeline where they took effect."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.browser import drive_page
from tests.support.proxy_host import ProxyHost, run, wait_idle
from tests.support.resume_client import Leg
from tests.support.streams import FAST_MODEL

pytestmark = [pytest.mark.triton, pytest.mark.browser]

TOKEN = "browser-recordings-token"

SHOW_FIRST = """
new Promise((resolve) => {
  document.querySelector("tr.pick").click();
  const deadline = Date.now() + 30000;
  const poll = () => {
    const video = document.getElementById("video");
    const marks = document.querySelectorAll("#timeline .mark").length;
    if ((document.title.startsWith("rtvideo recordings: showing") && video.readyState >= 1) || Date.now() > deadline) {
      resolve(JSON.stringify({title: document.title, marks, duration: video.duration,
                              error: video.error && video.error.code,
                              lefts: [...document.querySelectorAll("#timeline .mark")].map((m) => m.style.left)}));
    } else setTimeout(poll, 100);
  };
  poll();
})
"""


def test_the_recordings_page_lists_plays_and_marks_the_interactions(triton, tmp_path: Path) -> None:
    wait_idle(triton)
    host = ProxyHost(triton.grpc_url)
    try:
        server = host.server(model=FAST_MODEL, recordings=str(tmp_path / "rec"), token=TOKEN)

        async def body() -> dict[str, Any]:
            owner = await Leg.open(server.url + "?token=" + TOKEN)
            start = await owner.start("a lighthouse in a storm", seed=3, num_frames=9 * 8, record=True)
            await owner.interact("a calm sea at noon", "calm", 1)
            await owner.until("session.done")
            return start

        start = run(body())
        rid = start["recording_id"]
        while (tmp_path / "rec" / rid / "manifest.json").exists() is False:  # closed off the loop
            time.sleep(0.05)
        found = drive_page(
            f"http://127.0.0.1:{server.port}/recordings.html?token={TOKEN}",
            {
                "rows": "document.querySelectorAll('tr.pick').length",
                "first": "document.querySelector('tr.pick').dataset.id",
                "shown": SHOW_FIRST,
            },
            done_title="rtvideo recordings: listed",
        )
    finally:
        host.close()
    assert found["rows"] == 1 and found["first"] == rid, found
    shown = json.loads(found["shown"])
    assert shown["title"] == f"rtvideo recordings: showing {rid}" and shown["error"] is None, shown
    assert shown["duration"] > 0, shown  # the browser plays video.mp4 as served
    assert shown["marks"] == 1 and 0 < float(shown["lefts"][0].rstrip("%")) < 100, shown  # "calm", mid-stream
