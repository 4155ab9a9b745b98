"""Chromium's own WebRTC as a WHEP viewer (docs/protocol.md §9.5): a WHEP client of a few lines,
run in a page of the proxy's origin, watches a live session. Asserted on the screen: the video
element's time advances and its picture is lit (pixels sampled from it); then the page's
DELETE ends the viewer, and nothing is left in the proxy. The screenshot is kept
(`RTVIDEO_SCREENSHOT_DIR`)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

from tests.browser.cdp import browser
from tests.browser.test_browser_demo import keep_screenshot
from tests.support.proxy_host import wait_idle
from tests.support.resume_client import Leg
from tests.support.streams import PACED_MODEL

#: generous: only bounds a hang (CI runs on 2 shared cores)
PLAY_SECONDS = 90.0

#: the page's WHEP client: the lines docs/protocol.md §9.5 shows, and a video element
WHEP_CLIENT = """(async () => {
  document.body.innerHTML = '<video id="video" autoplay muted playsinline width="640"></video>';
  const video = document.getElementById('video');
  const pc = new RTCPeerConnection();
  window.pc = pc;
  pc.addTransceiver('video', {direction: 'recvonly'});
  pc.ontrack = (e) => { video.srcObject = new MediaStream([e.track]); };
  await pc.setLocalDescription(await pc.createOffer());
  await new Promise((ok) => { if (pc.iceGatheringState === 'complete') ok();
    else pc.onicegatheringstatechange = () => pc.iceGatheringState === 'complete' && ok(); });
  const r = await fetch('/v1/realtime/video/whep', {method: 'POST', body: pc.localDescription.sdp,
    headers: {'Content-Type': 'application/sdp', 'Authorization': 'Bearer ' + %s}});
  if (r.status !== 201) return 'refused ' + r.status + ': ' + await r.text();
  window.resource = r.headers.get('Location');
  await pc.setRemoteDescription({type: 'answer', sdp: await r.text()});
  return 'ok';
})()"""


#: JavaScript: what the page's WebRTC saw (for a failure's message)
STATS = """(async () => {
  const out = {connection: pc.connectionState, ice: pc.iceConnectionState, inbound: null, codec: null};
  (await pc.getStats()).forEach((s) => {
    if (s.type === 'inbound-rtp' && s.kind === 'video') out.inbound = s;
    if (s.type === 'codec') out.codec = s.mimeType + ' ' + (s.sdpFmtpLine || '');
  });
  return JSON.stringify(out);
})()"""


def test_chromium_watches_a_session_over_whep(demo_proxy, triton, tmp_path: Path) -> None:
    wait_idle(triton, PACED_MODEL)
    tokens: list[str] = []
    stop = threading.Event()
    failures: list[BaseException] = []

    async def own() -> None:  # the session's owner, reading all along, until the test is done
        owner = await Leg.open(demo_proxy.url)
        start = await owner.start("a red kite over green hills", seed=41, num_frames=9 * 400, watchable=True)
        tokens.append(start["watch_token"])
        while not stop.is_set():
            try:
                await owner.read(0.5)
            except (asyncio.TimeoutError, TimeoutError):
                continue
        await owner.send({"type": "session.stop"})
        while (await owner.read(60))["type"] != "session.done":
            pass

    def run_owner() -> None:
        try:
            asyncio.run(asyncio.wait_for(own(), 300))
        except Exception as exc:  # noqa: BLE001  # reported by the test, whatever it was
            failures.append(exc)

    owner = threading.Thread(target=run_owner, name="owner", daemon=True)
    owner.start()
    try:
        deadline = time.monotonic() + 60
        while not tokens:
            assert not failures, failures
            assert time.monotonic() < deadline, "the owner's session did not start"
            time.sleep(0.1)
        with browser() as chromium:
            page = chromium.open(f"http://127.0.0.1:{demo_proxy.port}/recordings.html")
            # the page's own document, loaded: a new target starts on about:blank, whose
            # readyState is already 'complete' before the navigation commits
            page.wait("location.pathname === '/recordings.html' && document.readyState === 'complete'")
            assert page.eval(WHEP_CLIENT % json.dumps(tokens[0]), timeout=60) == "ok"
            assert len(demo_proxy.whep_viewers) == 1
            try:
                first = page.wait(
                    "(() => { const v = document.getElementById('video'); return v.currentTime > 0 && v.currentTime; })()",
                    timeout=PLAY_SECONDS,
                )
            except AssertionError as exc:
                raise AssertionError(f"{exc}; the page's WebRTC: {page.eval(STATS)}") from exc
            page.wait(
                f"document.getElementById('video').currentTime > {first} + 1", timeout=PLAY_SECONDS
            )  # time advances
            picture = page.picture()
            assert picture["width"] > 0 and picture["lit"] > 0.2, picture  # a lit picture, not black
            assert page.eval("pc.connectionState") == "connected"
            shot = page.screenshot(tmp_path / "whep_chromium.png")
            keep_screenshot(shot)
            status = page.eval("fetch(window.resource, {method: 'DELETE'}).then((r) => r.status)")
            assert status == 200
            assert len(demo_proxy.whep_viewers) == 0  # closed before the DELETE was answered
            page.wait(
                "['disconnected', 'failed', 'closed'].includes(pc.connectionState) || pc.getReceivers()[0].track.readyState === 'ended'",
                timeout=60,
            )
    finally:
        stop.set()
        owner.join(120)
    assert not failures, failures
    assert not owner.is_alive()
