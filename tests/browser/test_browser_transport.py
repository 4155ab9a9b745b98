"""The demo page's transport and layout as a person sees them (issue 49, item 3), in a real
headless Chromium against the real proxy:

- the owner's page and a steer view play over WebRTC (WHEP) and say so ("WebRTC" beside the
  video), the picture lit and its time advancing; the owner's offers a WHEP URL and the bearer
  token players take;
- a watch view with `?transport=mse` falls back to MSE and says "MSE", and plays;
- nothing scrolls sideways at 800, 1024 and 1280 px in any state (live, revoked, reconnecting,
  ended): `document.documentElement.scrollWidth <= clientWidth`, nothing past the right edge;
- a watch view whose link drops shows "reconnecting" (retries not logged as errors), then
  "watching" again once rejoined, and says which chunks it missed while away.

Screenshots are kept (`RTVIDEO_SCREENSHOT_DIR`, as the other browser tests keep theirs)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

from tests.browser.cdp import Page, browser
from tests.browser.test_browser_participants import TEXT, plays, shot
from tests.support.proxy_host import ProxyHost, wait_idle
from tests.support.resume_client import Leg
from tests.support.streams import PACED_MODEL
from tests.support.tcp_relay import TcpRelay

pytestmark = [pytest.mark.triton, pytest.mark.browser]

#: the widths a person's window may have: below ~1135 px the header once pushed the page sideways
WIDTHS = (800, 1024, 1280)
#: JavaScript: the transport label's text
TRANSPORT = "document.getElementById('transport').textContent"
#: generous: only bounds a hang (WebRTC's first frame on 2 loaded cores)
WEBRTC_SECONDS = 120.0


def no_sideways_scroll(page: Page, folder: Path, state: str) -> None:
    """At each width: the page does not scroll sideways and nothing reaches past its right edge;
    a screenshot of each (the header's tools wrap to a second line rather than leave the screen)."""
    for width in WIDTHS:
        page.size(width)
        found = page.overflow()
        assert found["scroll"] <= found["width"] and not found["past"], (state, width, found)
        shot(page, folder, f"transport-{state}-{width}.png")
    page.size(1280)


def test_owner_plays_over_webrtc_a_forced_watcher_over_mse_and_nothing_scrolls_sideways(
    demo_proxy: Any, triton: Any, tmp_path: Path
) -> None:
    wait_idle(triton, PACED_MODEL)
    base = f"http://127.0.0.1:{demo_proxy.port}/"
    query = urlencode({"prompt": "a red lighthouse at sunset", "seed": 5, "autostart": 1, "stop_after": 400})
    with browser() as chromium:
        owner = chromium.open(base + "?" + query)
        owner.wait(
            "window.rtvideoDemo && window.rtvideoDemo.steerLink && window.rtvideoDemo.session.summary.chunks >= 2"
        )
        owner.wait(f"{TRANSPORT} === 'WebRTC'", timeout=WEBRTC_SECONDS)
        assert owner.eval("document.getElementById('video').srcObject !== null")  # the shown <video> is WebRTC's
        plays(owner, "the owner over WebRTC")
        assert len(demo_proxy.whep_viewers) == 1
        # The timeline still follows an update to the screen (the WebSocket's metadata, the MSE clock).
        owner.eval(
            "document.getElementById('update').value = 'a snowy forest at night';"
            "document.getElementById('send-update').click()"
        )
        row = owner.wait(
            "(() => { const li = document.querySelector('#timeline li[data-event-id]');"
            " return li && li.innerText.includes('on screen in') && li.innerText; })()",
            timeout=60,
        )
        assert "a snowy forest at night" in row and "queued in" in row, row
        assert owner.eval(TRANSPORT) == "WebRTC"
        # A player's WHEP URL and the bearer token it takes (the session's watch token).
        whep_url = owner.eval("document.getElementById('whep-url').value")
        bearer = owner.eval("document.getElementById('whep-token').value")
        assert whep_url == f"{base}v1/realtime/video/whep" and bearer.startswith("wv1."), (whep_url, bearer)
        assert owner.eval("getComputedStyle(document.getElementById('players-card')).display") != "none"
        no_sideways_scroll(owner, tmp_path, "owner-live")  # the header's three buttons shown

        links = json.loads(owner.eval("JSON.stringify([window.rtvideoDemo.watchLink, window.rtvideoDemo.steerLink])"))
        watcher = chromium.open(links[0] + "&transport=mse")
        watcher.wait(
            "window.rtvideoDemo && window.rtvideoDemo.session && window.rtvideoDemo.session.summary.chunks >= 2"
        )
        plays(watcher, "the watcher over MSE")
        assert watcher.eval(TRANSPORT) == "MSE"
        assert "transport=mse" in watcher.eval("document.getElementById('transport').title")
        assert watcher.eval("document.getElementById('video').srcObject") is None
        assert watcher.eval(TEXT % "status") == "watching"
        no_sideways_scroll(watcher, tmp_path, "watcher-live")

        steerer = chromium.open(links[1])
        steerer.wait(
            "window.rtvideoDemo && window.rtvideoDemo.session && window.rtvideoDemo.session.summary.chunks >= 1"
        )
        steerer.wait(f"{TRANSPORT} === 'WebRTC'", timeout=WEBRTC_SECONDS)  # its own steer token's viewer
        plays(steerer, "the steerer over WebRTC")
        owner.eval("document.getElementById('revoke-steer').click()")
        steerer.wait("document.getElementById('status').textContent === 'revoked'", timeout=30)
        assert steerer.eval(TRANSPORT) == "MSE"  # revoked: its viewer ended too; what it received stays
        no_sideways_scroll(steerer, tmp_path, "steerer-revoked")

        owner.eval("document.getElementById('stop').click()")
        for page, who in ((owner, "owner"), (watcher, "watcher")):
            page.wait("document.title === 'rtvideo demo: done'", timeout=60)
            assert page.eval(TEXT % "status") == "ended", who
            page.eval("document.getElementById('log-panel').open = true")
            no_sideways_scroll(page, tmp_path, f"{who}-ended")
        # Ended: the token was shown once; the WebRTC viewer is gone; the MSE <video> holds the whole stream.
        assert owner.eval("document.getElementById('whep-token').value") == ""
        assert owner.eval("document.getElementById('players-card').hidden") is True
        owner.wait("document.getElementById('video').srcObject === null", timeout=10)
    deadline = time.monotonic() + 30  # the proxy ends its viewers with the session (after what it had queued)
    while len(demo_proxy.whep_viewers):
        assert time.monotonic() < deadline, len(demo_proxy.whep_viewers)
        time.sleep(0.2)


def test_the_watch_badge_goes_back_to_watching_and_missed_chunks_are_said(
    demo_proxy: Any, triton: Any, tmp_path: Path
) -> None:
    wait_idle(triton, PACED_MODEL)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    relay = TcpRelay(demo_proxy.port)
    asyncio.run_coroutine_threadsafe(relay.up(), loop).result(10)
    token: dict[str, str] = {}
    ready, over = threading.Event(), threading.Event()

    async def owner() -> None:  # ~40 s of stream, read as it comes
        leg = await Leg.open(demo_proxy.url)
        start = await leg.start("boats in a harbour at dusk", seed=8, num_frames=9 * 72, watchable=True)
        token["watch"] = start["watch_token"]
        ready.set()
        await leg.until("session.done", timeout=240)
        await leg.conn.close()
        over.set()

    owner_thread = threading.Thread(target=lambda: asyncio.run(owner()), daemon=True)
    owner_thread.start()
    try:
        assert ready.wait(60)
        with browser() as chromium:
            # the WebSocket's picture (what a drop cuts); a window of rejoins that outlasts the checks made while away
            query = urlencode({"watch": token["watch"], "transport": "mse", "rejoin_seconds": 120})
            page = chromium.open(f"http://127.0.0.1:{relay.port}/?{query}")
            page.wait(
                "window.rtvideoDemo && window.rtvideoDemo.session && window.rtvideoDemo.session.client.lastIndex >= 2"
            )
            plays(page, "the watcher")
            assert page.eval(TEXT % "status") == "watching"
            before = page.eval("window.rtvideoDemo.session.summary.chunks")
            # The link goes and stays gone (a proxy restarting): the badge says so, the page still fits.
            asyncio.run_coroutine_threadsafe(relay.down(), loop).result(10)
            page.wait("document.getElementById('status').textContent === 'reconnecting'", timeout=30)
            page.wait("window.rtvideoDemo.session.client.reconnecting", timeout=10)
            no_sideways_scroll(page, tmp_path, "watcher-reconnecting")
            page.wait("document.getElementById('status').title.startsWith('try ')", timeout=10)
            asyncio.run_coroutine_threadsafe(relay.up(), loop).result(10)
            page.wait("window.rtvideoDemo.session.client.rejoins >= 1", timeout=30)
            page.wait("document.getElementById('status').textContent === 'watching'", timeout=30)  # back to live
            plays(page, "the rejoined watcher")
            # Seconds away: the rejoined link goes on from the live edge, and the page says what it missed.
            page.wait("!document.getElementById('skip-note').hidden", timeout=30)
            note = page.eval(TEXT % "skip-note")
            assert "Missed" in note and "reconnecting" in note, note
            skipped = json.loads(page.eval("JSON.stringify(window.rtvideoDemo.session.client.skipped)"))
            assert skipped and all(s["to"] >= s["from"] for s in skipped), skipped
            try:  # it receives again, past what it missed
                page.wait(f"window.rtvideoDemo.session.summary.chunks > {before} + 2", timeout=30)
            except AssertionError as exc:
                raise AssertionError(page.eval(TEXT % "log")[-3000:]) from exc
            shot(page, tmp_path, "transport-watcher-rejoined-1280.png")
            errors = page.eval("[...document.querySelectorAll('#log .err')].map(e => e.textContent).join('')")
            assert "reconnecting" not in errors and "rejoin" not in errors, errors  # retries are not errors
            page.wait("document.title === 'rtvideo demo: done'", timeout=180)
            assert page.eval(TEXT % "status") == "ended"
        assert over.wait(120)
    finally:
        asyncio.run_coroutine_threadsafe(relay.down(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        owner_thread.join(10)


def test_the_owner_copies_a_broadcast_url_that_serves_the_playlist(triton: Any, tmp_path: Path) -> None:
    wait_idle(triton, PACED_MODEL)
    host = ProxyHost(triton.grpc_url)
    try:
        server = host.server(model=PACED_MODEL, broadcast_store=str(tmp_path / "broadcasts"))
        base = f"http://127.0.0.1:{server.port}/"
        query = urlencode({"prompt": "a deep blue ocean", "seed": 2, "autostart": 1, "broadcast": 1, "stop_after": 400})
        with browser() as chromium:
            owner = chromium.open(base + "?" + query)
            owner.wait(
                "window.rtvideoDemo && window.rtvideoDemo.session && window.rtvideoDemo.session.summary.chunks >= 3"
            )
            assert owner.eval("document.getElementById('broadcast-row').hidden") is False
            url = owner.eval("document.getElementById('broadcast-url').value")
            assert url.startswith(base) and url.endswith("/index.m3u8"), url
            playlist = owner.eval(f"fetch({json.dumps(url)}).then((r) => r.text())")  # the URL a player is given
            assert playlist.startswith("#EXTM3U") and "#EXT-X-MAP" in playlist, playlist
            shot(owner, tmp_path, "transport-owner-broadcast-1280.png")
            # The owner ends the broadcast, not the session: the playlist ends, the session plays on.
            owner.eval("document.getElementById('end-broadcast').click()")
            owner.wait("document.getElementById('broadcast-state').textContent.startsWith('ended')", timeout=30)
            ended = owner.eval(f"fetch({json.dumps(url)}).then((r) => r.text())")
            assert "#EXT-X-ENDLIST" in ended, ended
            assert owner.eval(TEXT % "status") == "streaming"
            owner.eval("document.getElementById('stop').click()")
            owner.wait("document.title === 'rtvideo demo: done'", timeout=60)
            # ended: the playlist stays to share (with its end); the watch token's rows are gone
            assert owner.eval("document.getElementById('players-card').hidden") is False
            assert owner.eval("document.getElementById('broadcast-url').value") == url
            assert owner.eval("document.getElementById('whep-rows').hidden") is True
    finally:
        host.close()
