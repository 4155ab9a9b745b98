"""The watch view comes back by itself (rtvideo.js, docs/decisions.md "Watchers and steerers
across replicas"): headless Chromium watches a session through a TCP relay in front of the real
proxy; the relay is cut (the network goes, as when the watcher's proxy dies) and the page opens
its watch link again with the same token, says so, and plays on to the session's end without
an error."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any
from urllib.parse import urlencode

from tests.browser.cdp import browser
from tests.browser.test_browser_participants import TEXT, plays
from tests.support.proxy_host import wait_idle
from tests.support.resume_client import Leg
from tests.support.streams import PACED_MODEL
from tests.support.tcp_relay import TcpRelay

#: what the watch page holds: its client's rejoins and last index, what it received, the end
STATE = """(() => { const s = window.rtvideoDemo.session;
  return JSON.stringify({rejoins: s.client.rejoins, last: s.client.lastIndex, payloads: s.player.payloads.length,
    done: s.summary.done, errors: s.summary.errors}); })()"""


def test_the_watch_view_rejoins_after_its_link_drops(demo_proxy: Any, triton: Any) -> None:
    wait_idle(triton, PACED_MODEL)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    relay = TcpRelay(demo_proxy.port)
    asyncio.run_coroutine_threadsafe(relay.up(), loop).result(10)
    token: dict[str, str] = {}
    ready, over = threading.Event(), threading.Event()

    async def owner() -> None:  # ~30 s of stream, read as it comes
        leg = await Leg.open(demo_proxy.url)
        start = await leg.start("boats in a harbour at dusk", seed=6, num_frames=9 * 56, watchable=True)
        token["watch"] = start["watch_token"]
        ready.set()
        await leg.until("session.done", timeout=180)
        await leg.conn.close()
        over.set()

    owner_thread = threading.Thread(target=lambda: asyncio.run(owner()), daemon=True)
    owner_thread.start()
    try:
        assert ready.wait(60)
        with browser() as chromium:
            page = chromium.open(f"http://127.0.0.1:{relay.port}/?{urlencode({'watch': token['watch']})}")
            page.wait(
                "window.rtvideoDemo && window.rtvideoDemo.session && window.rtvideoDemo.session.client.lastIndex >= 2"
            )
            plays(page, "the watcher")
            before = json.loads(page.eval(STATE))
            loop.call_soon_threadsafe(relay.cut)  # the page's socket drops: no close frame
            page.wait("window.rtvideoDemo.session.client.rejoins >= 1", timeout=30)
            page.wait(f"window.rtvideoDemo.session.client.lastIndex >= {before['last'] + 3}", timeout=30)
            plays(page, "the rejoined watcher")
            page.wait("document.title === 'rtvideo demo: done'", timeout=120)
            state = json.loads(page.eval(STATE))
            log = page.eval(TEXT % "log")
        assert state["rejoins"] == 1 and "reconnecting" in log, log[-2000:]
        assert state["done"] is not None and not state["errors"], state
        assert state["payloads"] > before["payloads"] + 3  # it went on receiving, no payload twice (rtvideo.js)
        assert over.wait(120)
    finally:
        asyncio.run_coroutine_threadsafe(relay.down(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        owner_thread.join(10)
