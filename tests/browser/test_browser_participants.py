"""What a person sees on the demo page, whatever their role (docs/protocol.md §9): an owner's,
a watcher's and a steerer's page of one session, open at once in one headless Chromium.

Asserted on the screen, not on buffered ranges: each page's video time advances and its
picture is not black within a few seconds of joining (pixels sampled from the video
element), the owner's caption and timeline follow a steerer's update and the steerer's the
owner's, the watcher is refused nothing while it watches, each guest sees "ended" and only
what its role allows, and nothing overflows at 1280 and 800 px. The screenshots are kept
(`RTVIDEO_SCREENSHOT_DIR`, as the demo tests keep theirs)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from tests.browser.cdp import Page, browser
from tests.browser.test_browser_demo import keep_screenshot
from tests.support.proxy_host import wait_idle
from tests.support.streams import PACED_MODEL

#: seconds a joining page has to show a moving, lit picture
JOIN_SECONDS = 8.0
#: how long the watcher watches while nothing may be refused (bounded: CI has 2 cores)
WATCH_SECONDS = 60.0
DISPLAY = "getComputedStyle(document.getElementById(%r)).display"
TEXT = "document.getElementById(%r).textContent"


def plays(page: Page, who: str) -> dict[str, Any]:
    """Within JOIN_SECONDS the page's video time advances and its picture is lit."""
    deadline = time.monotonic() + JOIN_SECONDS
    first = page.picture()
    while True:
        time.sleep(0.5)
        now = page.picture()
        if now["time"] > first["time"] + 0.2 and now["lit"] > 0.5:
            return now
        assert time.monotonic() < deadline, f"{who}'s page does not play: {first} then {now}"


def shot(page: Page, folder: Path, name: str, full: bool = False) -> Path:
    path = page.screenshot(folder / name, full=full)
    keep_screenshot(path)
    return path


def fits(page: Page, who: str) -> None:
    found = page.overflow()
    assert found["scroll"] <= found["width"] and not found["past"] and not found["clipped"], (who, found)


def test_owner_watcher_and_steerer_pages_play_and_tell_one_story(demo_proxy, triton, tmp_path: Path) -> None:
    wait_idle(triton, PACED_MODEL)
    base = f"http://127.0.0.1:{demo_proxy.port}/"
    # ~84 s of stream: long enough to join mid-way, steer both ways and watch WATCH_SECONDS
    query = urlencode({"prompt": "a red lighthouse at sunset", "seed": 7, "autostart": 1, "stop_after": 150})
    with browser() as chromium:
        owner = chromium.open(base + "?" + query)
        owner.wait(
            "window.rtvideoDemo && window.rtvideoDemo.steerLink && window.rtvideoDemo.session.summary.chunks >= 2"
        )
        plays(owner, "the owner")
        links = owner.eval("JSON.stringify([window.rtvideoDemo.watchLink, window.rtvideoDemo.steerLink])")
        watch_link, steer_link = json.loads(links)
        time.sleep(2.0)  # they join seconds into the stream: what they hold starts there, not at 0
        watcher = chromium.open(watch_link)
        steerer = chromium.open(steer_link)
        joined = time.monotonic()
        seen = {"watcher": plays(watcher, "the watcher"), "steerer": plays(steerer, "the steerer")}
        assert time.monotonic() - joined < 2 * JOIN_SECONDS
        assert all(p["time"] > 1.0 for p in seen.values()), seen  # mid-stream: the page moved to the live edge
        # What each role may do: no Start and no prompt for a watcher; a steerer steers but never starts.
        assert watcher.eval(DISPLAY % "session-form") == "none" and watcher.eval(DISPLAY % "update-form") == "none"
        assert steerer.eval(DISPLAY % "session-form") == "none" and steerer.eval(DISPLAY % "update-form") != "none"
        assert owner.eval(DISPLAY % "guest-card") == "none" and watcher.eval(DISPLAY % "guest-card") != "none"

        # The steerer's update: the owner's caption and timeline follow it, marked as a guest's.
        steerer.eval(
            "document.getElementById('update').value = 'a snowy forest at night';"
            "document.getElementById('send-update').click()"
        )
        owner.wait("document.getElementById('now-playing').textContent.includes('a snowy forest at night')", timeout=15)
        assert "from a steerer" in owner.eval(TEXT % "now-playing")
        row = owner.wait("(document.querySelector('#timeline li[data-from=steerer]') || {}).innerText", timeout=5)
        assert "a snowy forest at night" in row and "GUEST" in row.upper(), row
        # ... and the owner's, on the steerer's page and the watcher's.
        owner.eval(
            "document.getElementById('update').value = 'a deep blue ocean';"
            "document.getElementById('send-update').click()"
        )
        for page in (steerer, watcher):
            page.wait("document.getElementById('now-playing').textContent.includes('a deep blue ocean')", timeout=15)
            assert "from the owner" in page.eval(TEXT % "now-playing")
        # A watcher sends no updates: its ack meter says whose acks it sees none of, not "no updates yet".
        hint = watcher.eval(TEXT % "m-ack-hint")
        assert hint == "2 updates by others; acks go to their sender", hint
        time.sleep(1.5)  # the transition shows
        shot(owner, tmp_path, "participants-owner-1280.png")
        shot(watcher, tmp_path, "participants-watcher-1280.png")
        shot(steerer, tmp_path, "participants-steerer-1280.png")

        # A watcher watches without a single refusal, and keeps up.
        watched = time.monotonic()
        while time.monotonic() - watched < WATCH_SECONDS:
            time.sleep(2.0)
            errors = json.loads(watcher.eval("JSON.stringify(window.rtvideoDemo.session.summary.errors)"))
            assert errors == [], errors
            lag = watcher.eval(
                "(() => { const v = document.getElementById('video'); const b = v.buffered;"
                " return b.length ? b.end(b.length - 1) - v.currentTime : 0; })()"
            )
            assert lag < 3.0, lag  # within the live edge (the player jumps ahead past 2.5 s)

        # The owner's stop_after ends it: every page says "ended"; the guests' controls are gone.
        for page, who in ((owner, "owner"), (watcher, "watcher"), (steerer, "steerer")):
            page.wait("document.title === 'rtvideo demo: done'", timeout=60)
            assert page.eval(TEXT % "status") == "ended", (who, page.eval(TEXT % "log")[-3000:])
        assert steerer.eval(DISPLAY % "update-form") == "none" and steerer.eval(DISPLAY % "camera-card") == "none"
        assert "has ended" in steerer.eval(TEXT % "guest-card") and "has ended" in watcher.eval(TEXT % "guest-card")
        summary = json.loads(watcher.eval(TEXT % "summary"))
        assert summary["errors"] == [] and summary["video_error"] is None, summary
        refused = demo_proxy.context.metrics.registry.get_sample_value(
            "rtvideo_proxy_errors_total", {"code": "invalid_message"}
        )
        assert not refused, refused  # nobody was sent an invalid_message

        # Nothing overflows at 1280 or 800 px, the log open (its long lines once widened the page).
        for page, who in ((owner, "owner"), (steerer, "steerer")):
            page.eval("document.getElementById('log-panel').open = true")
            for width in (1280, 800):
                page.size(width)
                fits(page, f"{who} at {width}")
        shot(owner, tmp_path, "participants-owner-ended-800.png", full=True)
        owner.size(1280)
        shot(owner, tmp_path, "participants-owner-ended-1280.png")
        shot(steerer, tmp_path, "participants-steerer-ended-1280.png")


def test_a_revoked_steerer_sees_revoked_not_failed(demo_proxy, triton, tmp_path: Path) -> None:
    from tests.support.resume_client import Leg

    wait_idle(triton, PACED_MODEL)
    ready = threading.Event()
    revoke = threading.Event()
    token: dict[str, str] = {}

    async def owner() -> None:
        leg = await Leg.open(demo_proxy.url)
        start = await leg.start("boats in a harbour", seed=4, num_frames=9 * 40, steerable=True)
        token["steer"] = start["steer_token"]
        ready.set()
        while not revoke.is_set():
            await leg.read(30)
        await leg.send({"type": "session.revoke_steering"})
        await leg.until("session.steering_revoked")
        await leg.send({"type": "session.stop"})
        await leg.until("session.done", timeout=60)

    thread = threading.Thread(target=lambda: asyncio.run(owner()), daemon=True)
    thread.start()
    assert ready.wait(60)
    with browser() as chromium:
        steerer = chromium.open(f"http://127.0.0.1:{demo_proxy.port}/?" + urlencode({"steer_token": token["steer"]}))
        plays(steerer, "the steerer")
        revoke.set()
        steerer.wait("document.title === 'rtvideo demo: done'", timeout=30)
        assert steerer.eval(TEXT % "status") == "revoked"
        assert steerer.eval(DISPLAY % "update-form") == "none"
        assert "revoked" in steerer.eval(TEXT % "guest-card") and "revoked" in steerer.eval(TEXT % "notice")
        shot(steerer, tmp_path, "steerer-revoked-1280.png")
    thread.join(60)


FIRST_PAYLOAD = """(async () => {
  const s = window.rtvideoDemo.session;
  if (!s.player.payloads.length) return JSON.stringify({log: document.getElementById('log').textContent});
  const digest = await crypto.subtle.digest('SHA-256', s.player.payloads[0]);
  return JSON.stringify({seed: document.getElementById('seed-shown').dataset.seed,
    hash: [...new Uint8Array(digest)].map(b => b.toString(16).padStart(2, '0')).join(''),
    config: s.client.config.seed.toString()});
})()"""


def test_a_shown_seed_reproduces_the_first_chunk_byte_for_byte(demo_proxy, triton) -> None:
    """A seed the server drew (to 2^63−1: beyond JavaScript's exact integers) is shown exactly, and
    a session started with it streams the same first payload."""
    wait_idle(triton, PACED_MODEL)
    base = f"http://127.0.0.1:{demo_proxy.port}/?"
    common = {"prompt": "a campfire burning at night", "autostart": 1, "stop_after": 2}
    with browser() as chromium:
        first = chromium.open(base + urlencode(common))
        first.wait("document.title === 'rtvideo demo: done'", timeout=60)
        drawn = json.loads(first.eval(FIRST_PAYLOAD))
        assert "hash" in drawn, drawn  # else the page's log
        assert drawn["seed"] == drawn["config"] and drawn["seed"].isdigit(), drawn
        again = chromium.open(base + urlencode({**common, "seed": drawn["seed"]}))
        again.wait("document.title === 'rtvideo demo: done'", timeout=60)
        repeated = json.loads(again.eval(FIRST_PAYLOAD))
    assert "hash" in repeated, repeated
    assert repeated["seed"] == drawn["seed"], (drawn, repeated)
    assert repeated["hash"] == drawn["hash"], (drawn, repeated)


def test_the_big_seed_a_person_types_goes_out_exact(demo_proxy, triton) -> None:
    """2^63−1 typed into the seed field starts a session with exactly that seed."""
    wait_idle(triton, PACED_MODEL)
    query = urlencode({"prompt": "a deep blue ocean", "autostart": 1, "stop_after": 1, "seed": 2**63 - 1})
    with browser() as chromium:
        page = chromium.open(f"http://127.0.0.1:{demo_proxy.port}/?{query}")
        page.wait("document.title === 'rtvideo demo: done'", timeout=60)
        assert page.eval("document.getElementById('seed-shown').dataset.seed") == str(2**63 - 1)
        assert page.eval(TEXT % "caption").startswith("256×256")


def test_an_empty_prompt_says_so(demo_proxy) -> None:
    with browser() as chromium:
        page = chromium.open(f"http://127.0.0.1:{demo_proxy.port}/")
        page.wait("document.readyState === 'complete' && window.rtvideoDemo")
        page.eval("document.getElementById('prompt').value = '  '; document.getElementById('start').click()")
        assert "Enter a prompt" in page.eval(TEXT % "notice")
        assert page.eval(DISPLAY % "notice") != "none" and page.eval(TEXT % "status") == "idle"
