"""Recordings as a person uses them, in a real headless Chromium against the real proxy: the
demo page's Record switch records a session and keeps its recording token; the recordings
page lists it from that token (and every recording with the operator's credential), plays its
video.mp4 with the interaction marked where it took effect, in the demo page's styles (its rows
look clickable); "branch from here" on chunk N starts a live session that shows `branch_exact`,
names the prompt in effect at chunk N, and runs for the length the person chose."""

from __future__ import annotations

import json
import time
from pathlib import Path
from urllib.parse import urlencode

import pytest

from tests.browser.cdp import browser
from tests.browser.test_browser_demo import keep_screenshot
from tests.browser.test_browser_participants import TEXT, plays, shot
from tests.support.proxy_host import ProxyHost, wait_idle
from tests.support.streams import PACED_MODEL

pytestmark = [pytest.mark.triton, pytest.mark.browser]

TOKEN = "browser-recordings-token"
ADMIN = "browser-recordings-operator"
DONE = "document.title === 'rtvideo demo: done'"
CHUNKS = 8
#: the branch's length a person types on the recordings page: 72 frames at 16 fps, 8 chunks of 9
BRANCH_SECONDS = 4.5
BRANCH_CHUNKS = 8


def started_at(events: Path, prompt: str) -> int:
    """The generation chunk at which the update with `prompt` took effect, from the event log."""
    lines = [json.loads(line) for line in events.read_text().splitlines() if line.strip()]
    ids = {
        line["message"]["interaction"]["event_id"]
        for line in lines
        if line["dir"] == "in"
        and line["message"].get("type") == "session.interaction"
        and line["message"]["interaction"].get("event", {}).get("prompt") == prompt
    }
    for line in lines:
        message = line["message"]
        is_media = message.get("type") == "video.chunk_metadata" and message.get("kind") == "media"
        if line["dir"] == "out" and is_media and ids & set(message.get("started_event_ids") or []):
            return int(message["generation_chunk_index"])
    raise AssertionError(f"{prompt!r} never started")


def test_record_list_play_and_branch_from_the_pages(triton, tmp_path: Path) -> None:
    wait_idle(triton, PACED_MODEL)
    host = ProxyHost(triton.grpc_url)
    try:
        server = host.server(
            model=PACED_MODEL,
            recordings=str(tmp_path / "rec"),
            token=TOKEN,
            admin_token=ADMIN,
            max_sessions_per_client=2,
        )
        base = f"http://127.0.0.1:{server.port}/"
        query = urlencode(
            {"prompt": "a lighthouse in a storm", "seed": 3, "autostart": 1, "record": 1, "token": TOKEN}
            | {"update": "a calm sea at noon", "update_after": 2, "transition_chunks": 1, "stop_after": CHUNKS}
        )
        with browser() as chromium:
            demo = chromium.open(base + "?" + query)
            demo.wait(DONE, timeout=90)
            kept = json.loads(demo.eval("localStorage.getItem('rtvideo.recordings')"))
            assert len(kept) == 1 and kept[0]["recording_token"], kept  # the token, kept in this browser
            rid = kept[0]["recording_id"]
            assert demo.eval(TEXT % "status") == "ended"
            while not (tmp_path / "rec" / rid / "manifest.json").exists():  # closed off the loop
                time.sleep(0.05)
            time.sleep(0.5)

            page = chromium.open(f"{base}recordings.html?token={TOKEN}")
            page.wait("document.title === 'rtvideo recordings: listed'", timeout=30)
            assert page.eval("[...document.querySelectorAll('tr.pick')].map(r => r.dataset.id).join()") == rid
            # The demo page's styles: its background, its dark header, cards; a row that looks clickable.
            looks = json.loads(
                page.eval(
                    "JSON.stringify({bg: getComputedStyle(document.body).backgroundColor,"
                    " header: getComputedStyle(document.querySelector('header')).backgroundColor,"
                    " card: getComputedStyle(document.getElementById('list-card')).borderRadius,"
                    " cursor: getComputedStyle(document.querySelector('tr.pick')).cursor,"
                    " chevron: getComputedStyle(document.querySelector('tr.pick td:last-child'), '::after').content,"
                    " tab: document.querySelector('tr.pick').tabIndex})"
                )
            )
            assert looks == {
                "bg": "rgb(243, 244, 247)",
                "header": "rgb(21, 26, 38)",
                "card": "10px",
                "cursor": "pointer",
                "chevron": '" \u203a"',  # the chevron after its last cell
                "tab": 0,
            }, looks
            for width in (800, 1024, 1280):
                page.size(width)
                found = page.overflow()
                assert found["scroll"] <= found["width"] and not found["past"], (width, found)
            shot(page, tmp_path, "recordings-listed-1280.png")
            page.eval("document.querySelector('tr.pick').click()")
            page.wait(f"document.title === 'rtvideo recordings: showing {rid}'", timeout=30)
            page.wait("document.getElementById('video').readyState >= 2", timeout=30)
            page.eval("document.getElementById('video').play()")
            plays(page, "the recording")  # video.mp4 as served, on the screen
            lefts = json.loads(
                page.eval("JSON.stringify([...document.querySelectorAll('#timeline .mark')].map(m => m.style.left))")
            )
            assert len(lefts) == 1 and 0 < float(lefts[0].rstrip("%")) < 100, lefts  # "calm", mid-stream
            links = json.loads(
                page.eval("JSON.stringify([...document.querySelectorAll('#chunks a')].map(a => a.href))")
            )
            assert len(links) >= CHUNKS, links
            assert "the clients sent" in page.eval("document.getElementById('player').textContent")
            shot(page, tmp_path, "recordings-showing-1280.png", full=True)

            # "branch from here" on chunk N, where the update took effect: a live session, exact, that
            # names the prompt in effect there (not the recording's first), for the length the person typed
            branch_at = started_at(tmp_path / "rec" / rid / "events.jsonl", "a calm sea at noon")
            assert 0 < branch_at < CHUNKS
            page.eval(
                f"document.getElementById('branch-seconds').value = '{BRANCH_SECONDS}';"
                "document.getElementById('branch-seconds').dispatchEvent(new Event('input'))"
            )
            page.leave_by(f"document.querySelector('#chunks a[data-chunk=\"{branch_at}\"]').click()")
            page.wait("location.pathname.endsWith('/') && window.rtvideoDemo && window.rtvideoDemo.session", timeout=30)
            page.wait(
                f"document.getElementById('caption').textContent.includes('at chunk {branch_at} (exact)')", timeout=30
            )
            assert page.eval(TEXT % "status") == "streaming"
            caption = page.eval(TEXT % "now-playing")
            assert caption.startswith("a calm sea at noon") and f"from chunk {branch_at}" in caption, caption
            plays(page, "the branch")
            shot(page, tmp_path, "branch-live-1280.png")
            page.wait(DONE, timeout=60)  # it ends by itself: a saved branch returns
            summary = json.loads(page.eval(TEXT % "summary"))
            assert page.eval(TEXT % "status") == "ended" and summary["done"]["stopped"] is False, summary
            recorded = json.loads((tmp_path / "rec" / rid / "manifest.json").read_text())
            assert summary["chunks"] == BRANCH_CHUNKS, summary  # the length asked, not the recording's rest
            assert recorded["chunks"] - branch_at < BRANCH_CHUNKS, recorded  # longer than the rest would have been

            # The operator's credential is never taken from a link: an old ?admin_token= link lists
            # only this browser's recordings, says why, and leaves the address bar without it.
            linked = chromium.open(f"{base}recordings.html?token={TOKEN}&admin_token={ADMIN}")
            linked.wait("document.title === 'rtvideo recordings: listed'", timeout=30)
            said = linked.eval(TEXT % "status")
            assert "recorded in this browser" in said and "not taken from a link" in said, said
            assert ADMIN not in linked.eval("location.href") and "admin_token" not in linked.eval("location.href")

            # The operator types it: every recording is listed; it stays out of the URL and storage.
            listing = chromium.open(f"{base}recordings.html?token={TOKEN}")
            listing.wait("document.title === 'rtvideo recordings: listed'", timeout=30)
            assert listing.eval("document.getElementById('admin').type") == "password"
            listing.eval(
                "document.getElementById('admin').value = 'not-the-operator';"
                "document.querySelector('#operator-form button').click()"
            )
            listing.wait("document.title === 'rtvideo recordings: error'", timeout=30)
            assert listing.eval(TEXT % "status") == "That is not the operator's credential (403)."
            listing.eval(
                f"document.getElementById('admin').value = {json.dumps(ADMIN)};"
                "document.querySelector('#operator-form button').click()"
            )
            listing.wait("document.getElementById('status').textContent.includes(\"all of this server's\")", timeout=30)
            assert listing.eval("document.querySelectorAll('tr.pick').length") == 1
            stored = listing.eval("JSON.stringify({...localStorage}) + JSON.stringify({...sessionStorage})")
            assert ADMIN not in stored and ADMIN not in listing.eval("location.href")
            keep_screenshot(listing.screenshot(tmp_path / "recordings-operator-1280.png"))
    finally:
        host.close()
