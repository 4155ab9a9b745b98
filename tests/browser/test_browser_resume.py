"""The demo page resumes a dropped socket (docs/protocol.md §9.1): headless Chromium, a real
proxy and Triton; the video plays on without a gap, and a watch view plays the same session."""

from __future__ import annotations

import json
from urllib.parse import urlencode

from tests.support.browser import drive_page
from tests.support.proxy_host import wait_idle
from tests.support.streams import PACED_MODEL

#: what the page holds once done: the client's resume count, the last index, the player's payloads and buffered ranges
STATE = """(() => { const s = window.rtvideoDemo.session; const b = document.getElementById('video').buffered;
  return JSON.stringify({resumes: s.client.resumes, last: s.client.lastIndex, payloads: s.player.payloads.length,
    frames: s.summary.frames, ranges: b.length, end: b.length ? b.end(b.length - 1) : 0, done: s.summary.done,
    errors: s.summary.errors, log: document.getElementById('log').textContent}); })()"""


def test_the_page_resumes_a_dropped_socket_and_plays_on_without_a_gap(demo_proxy, triton) -> None:
    wait_idle(triton, PACED_MODEL)
    query = urlencode(
        {
            "prompt": "a red lighthouse at sunset",
            "seed": 3,
            "autostart": 1,
            "resume": 1,
            "drop_after": 4,
            "stop_after": 10,
        }
    )
    state = json.loads(drive_page(f"http://127.0.0.1:{demo_proxy.port}/?{query}", {"state": STATE}, 180)["state"])
    assert state["resumes"] == 1, state["log"][-2000:]
    assert "reconnecting" in state["log"] and "resumed after chunk" in state["log"]
    assert state["done"] and state["done"]["stopped"] is True and not state["errors"]
    # every payload once, in order: the indices 0..last, one buffered range as long as every frame
    assert state["payloads"] == state["last"] + 1 == state["done"]["chunks"]
    assert state["ranges"] == 1 and abs(state["end"] - state["frames"] / 16) < 1e-3, state


def test_the_watch_view_plays_the_owners_session_read_only(demo_proxy, triton) -> None:
    import asyncio
    import threading

    from tests.support.resume_client import Leg

    wait_idle(triton, PACED_MODEL)
    token: dict[str, str] = {}
    ready = threading.Event()

    async def owner() -> None:
        leg = await Leg.open(demo_proxy.url)
        start = await leg.start("boats in a harbour", seed=4, num_frames=9 * 24, watchable=True)
        token["watch"] = start["watch_token"]
        ready.set()
        await leg.until("session.done", timeout=120)
        await leg.conn.close()

    thread = threading.Thread(target=lambda: asyncio.run(owner()), daemon=True)
    thread.start()
    assert ready.wait(60)
    query = urlencode({"watch": token["watch"]})
    state = json.loads(drive_page(f"http://127.0.0.1:{demo_proxy.port}/?{query}", {"state": STATE}, 180)["state"])
    thread.join(120)
    assert "watching a session" in state["log"] and state["done"] is not None
    assert state["payloads"] >= 2 and state["ranges"] == 1 and state["end"] > 0  # init pair, then live pairs
