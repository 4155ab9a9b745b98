"""The demo page at `GET /`, driven by its URL parameters in headless Chromium against a real
proxy and Triton: start, a prompt update mid-stream, stop, all played through MSE."""

from __future__ import annotations

import json
import os
import shutil
import urllib.request
from pathlib import Path
from urllib.parse import urlencode

from tests.support.browser import TEXT_OF, TIMELINE_ROWS, drive_page
from tests.support.proxy_host import wait_idle
from tests.support.streams import PACED_MODEL


def run_page(url: str, timeout: float = 120.0) -> tuple[str, str]:
    """Open `url` in headless Chromium in real time (virtual time would run ahead of the
    WebSocket), wait until the page's title says it is done, and return (summary, log) texts."""
    texts = drive_page(url, {"summary": TEXT_OF % "summary", "log": TEXT_OF % "log"}, timeout)
    return texts["summary"], texts["log"]


#: an element's text; textContent, since the log is folded in a <details> (innerText skips hidden content)


def keep_screenshot(path: Path) -> None:
    """Copy a screenshot to $RTVIDEO_SCREENSHOT_DIR, when set, for people to look at."""
    folder = os.environ.get("RTVIDEO_SCREENSHOT_DIR")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(folder) / path.name)


def test_the_page_is_served(demo_proxy) -> None:
    with urllib.request.urlopen(f"http://127.0.0.1:{demo_proxy.port}/", timeout=10) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/html")
        body = response.read().decode()
    assert '<pre id="summary">' in body and "/realtime/video" in body and "./rtvideo.js" in body
    with urllib.request.urlopen(f"http://127.0.0.1:{demo_proxy.port}/rtvideo.js", timeout=10) as response:
        assert response.status == 200
        assert "javascript" in response.headers["Content-Type"]
        module = response.read().decode()
    assert "export class RealtimeVideoClient" in module and "export class MsePlayer" in module


def test_demo_page_starts_updates_stops_and_plays(demo_proxy, triton) -> None:
    wait_idle(triton, PACED_MODEL)
    query = urlencode(
        {
            "prompt": "a lighthouse in a storm",
            "autostart": 1,
            "update": "a calm sea at noon",
            "transition_chunks": 2,
            "update_after": 2,
            "stop_after": 5,
        }
    )
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


def test_demo_timeline_follows_two_updates_to_their_ends(demo_proxy, triton, tmp_path: Path) -> None:
    """Start, two prompt updates, stop: the timeline shows each update from its ack to its end,
    and a screenshot of the page (at 1280x800) is kept for people to look at."""
    wait_idle(triton, PACED_MODEL)
    query = urlencode(
        [
            ("prompt", "a red lighthouse at sunset"),
            ("autostart", 1),
            ("seed", 7),
            ("update", "a snowy forest at night"),
            ("update_after", 2),
            ("update", "a busy city street at noon"),
            ("update_after", 3),
            ("transition_chunks", 4),
            ("stop_after", 10),
        ]
    )
    shot = tmp_path / "demo-timeline.png"
    found = drive_page(
        f"http://127.0.0.1:{demo_proxy.port}/?{query}",
        {
            "summary": TEXT_OF % "summary",
            "log": TEXT_OF % "log",
            "rows": TIMELINE_ROWS,
            "lead": "document.getElementById('m-lead').innerText",
            "ack": "document.getElementById('m-ack').innerText",
            "log_open": "document.getElementById('log-panel').open",
            "save_enabled": "!document.getElementById('save').disabled",
        },
        timeout=60,
        screenshot=shot,
    )
    keep_screenshot(shot)
    assert found["summary"], "the session did not end in time; the page's log:\n" + found["log"]
    summary = json.loads(found["summary"])
    assert summary["errors"] == [] and summary["video_error"] is None, summary
    assert summary["done"]["stopped"] is True and summary["chunks"] >= 10, summary
    assert len(summary["acks"]) == 2, summary
    ends = {"completed", "superseded", "interrupted", "failed", "unapplied", "unfinished"}
    timeline = {row["event_id"]: row for row in summary["timeline"]}
    assert set(timeline) == set(summary["acks"]), summary
    assert all(row["end"] in ends and row["ack_ms"] is not None for row in timeline.values()), timeline
    rows = json.loads(found["rows"])
    assert [row["id"] for row in rows] == summary["acks"], rows
    for row in rows:  # what a person sees: the end, on every row
        assert row["end"] == timeline[row["id"]]["end"] and row["end"] in row["text"].lower(), rows
        assert "queued in" in row["text"], rows
    # The second update always starts (it is the newest), and a stop well after it lets it complete.
    assert timeline[summary["acks"][1]]["end"] == "completed", timeline
    assert found["ack"].endswith("ms") and found["lead"].endswith("s"), found
    assert found["log_open"] is False and found["save_enabled"] is True, found
    assert shot.stat().st_size > 20_000  # a real picture of the page


def test_demo_page_starts_on_a_blend_then_sends_a_slerp_blend(demo_proxy, triton) -> None:
    """The blend card: a session started on a two-prompt blend, then a three-prompt slerp blend
    as an update, acked, started and completed; played through MSE."""
    wait_idle(triton, PACED_MODEL)
    query = urlencode(
        [
            ("autostart", 1),
            ("blend_start", 1),
            ("blend", "70:a red lighthouse at sunset"),
            ("blend", "30:a snowy forest at night"),
            ("seed", 5),
            ("stop_after", 7),
        ]
    )
    found = drive_page(
        f"http://127.0.0.1:{demo_proxy.port}/?{query}&blend_after=2&interpolation=slerp&transition_chunks=2"
        "&blend=1:a%20deep%20blue%20ocean",
        {
            "summary": TEXT_OF % "summary",
            "log": TEXT_OF % "log",
            "config": "JSON.stringify(window.rtvideoDemo.session.config)",
            "record": "JSON.stringify([...window.rtvideoDemo.session.client.interactions.values()][0])",
        },
        timeout=60,
    )
    assert found["summary"], "the session did not end in time; the page's log:\n" + found["log"]
    summary = json.loads(found["summary"])
    assert summary["errors"] == [] and summary["video_error"] is None, summary
    config = json.loads(found["config"])
    assert [p["text"] for p in config["prompts"]] == [
        "a red lighthouse at sunset",
        "a snowy forest at night",
        "a deep blue ocean",
    ], config
    assert [round(p["weight"], 4) for p in config["prompts"]] == [
        round(70 / 101, 4),
        round(30 / 101, 4),
        round(1 / 101, 4),
    ]
    assert len(summary["acks"]) == 1 and summary["acks"][0].startswith("blend-"), summary
    record = json.loads(found["record"])
    assert record["interpolation"] == "slerp" and len(record["prompts"]) == 3 and record["end"] == "completed", record
    ack = summary["acks"][0]
    assert f"started=[{ack}]" in found["log"] and f"completed=[{ack}]" in found["log"], found["log"]


RETRY_SCENARIO = """(async () => {
  const { RealtimeVideoClient, MsePlayer } = await import(new URL("rtvideo.js", location.href).href);
  const video = Object.assign(document.createElement("video"), { muted: true });
  document.body.appendChild(video);
  // retryMs: 1 resends the update every millisecond until its ack: several sends, one ack reported.
  const client = new RealtimeVideoClient(RealtimeVideoClient.urlFor(location), { retryMs: 1, maxAttempts: 200 });
  const player = new MsePlayer(video).attach(client);
  const seen = { queued: [], metas: [], bytes: 0, errors: [], started: [], states: [] };
  client.on("queued", d => seen.queued.push(d.eventId));
  client.on("chunk", ({ meta, data }) => { seen.metas.push(meta); seen.bytes += data.length; });
  client.on("error", m => seen.errors.push(m.code));
  client.on("interaction", r => seen.states.push(r.state));
  const ended = new Promise(resolve => player.on("ended", resolve));
  const done = new Promise(resolve => client.on("done", resolve));
  await client.connect();
  client.start("a deep blue ocean", { width: 64, height: 64, seed: 3 });
  await new Promise(resolve => client.on("video.start", resolve));
  // The first send of the update is lost on the way (as on a flaky network): only the resend,
  // retryMs later, reaches the server. Without this a fast ack could beat the first resend.
  const send = client.ws.send.bind(client.ws);
  let lost = false;
  client.ws.send = data => { if (!lost && data.includes("retry-1")) { lost = true; return; } send(data); };
  const ack = await client.interact("a red fire", { eventId: "retry-1", transitionChunks: 1 });
  let conflict = null;
  try { await client.interact("a green meadow", { eventId: "retry-1" }); } catch (e) { conflict = e.code; }
  while (seen.metas.filter(m => m.kind === "media").length < 4) await new Promise(r => setTimeout(r, 50));
  client.stop();
  const end = await ended;
  return JSON.stringify({ ack, conflict, seen, done: await done, end, codec: player.codec,
                          recorded: player.recording().size, record: client.interactions.get("retry-1") });
})()"""


def test_client_module_retries_safely_and_plays(demo_proxy, triton) -> None:
    """rtvideo.js in real Chromium against the real proxy: an update resent until its ack is
    acked once and applied once, a conflicting reuse of its id is refused without touching it,
    and the MSE player plays and records the whole stream (trailer included)."""
    wait_idle(triton, PACED_MODEL)
    found = drive_page(
        f"http://127.0.0.1:{demo_proxy.port}/", {"result": RETRY_SCENARIO}, timeout=60, done_title="rtvideo demo"
    )  # the idle demo page, loaded
    result = json.loads(found["result"])
    seen, record = result["seen"], result["record"]
    assert result["ack"]["eventId"] == "retry-1" and result["ack"]["attempts"] >= 2, result["ack"]
    assert seen["queued"] == ["retry-1"], seen["queued"]  # several acks arrived, one was reported
    assert result["conflict"] == "event_id_conflict" and seen["errors"] == ["event_id_conflict"], result
    started = [m for m in seen["metas"] if "retry-1" in m["started_event_ids"]]
    assert len(started) == 1 and record["end"] == "completed", (started, record)  # applied once
    assert seen["states"][:2] == ["sent", "queued"] and record["ackMs"] > 0, seen["states"]
    assert seen["metas"][-1]["kind"] == "trailer" and result["done"]["stopped"] is True
    assert result["recorded"] == seen["bytes"] == sum(m["byte_length"] for m in seen["metas"])
    assert result["codec"].startswith("avc1.") and result["end"]["error"] is None, result
    frames = sum(m["num_frames"] for m in seen["metas"])
    assert abs(result["end"]["bufferedEnd"] - frames / 16) < 1 / 16, (result["end"], frames)


def test_demo_steer_view_steers_anothers_session(demo_proxy, triton) -> None:
    """`?steer_token=`: the page joins a session someone else started, sends an update that is
    acked to the page alone, and follows the stream to the owner's end (docs/protocol.md §9.3)."""
    import asyncio
    import queue
    import threading

    from tests.support.resume_client import Leg

    wait_idle(triton, PACED_MODEL)
    tokens: queue.Queue[str] = queue.Queue()
    owner_messages: list[dict] = []

    async def owner() -> None:
        leg = await Leg.open(demo_proxy.url)
        start = await leg.start("a harbour at dusk", num_frames=9 * 30, steerable=True)
        tokens.put(start["steer_token"])
        while (await leg.read(120))["type"] != "session.done":
            pass
        owner_messages.extend(leg.messages)

    thread = threading.Thread(target=lambda: asyncio.run(owner()), daemon=True)
    thread.start()
    query = urlencode({"steer_token": tokens.get(timeout=60), "update": "a calm sea at noon", "update_after": 2})
    text, page_log = run_page(f"http://127.0.0.1:{demo_proxy.port}/?{query}")
    thread.join(120)
    assert text, "the session did not end in time; the page's log:\n" + page_log
    summary = json.loads(text)
    assert summary["errors"] == [], summary
    assert len(summary["acks"]) == 1, summary
    assert summary["done"] == owner_messages[-1], summary
    assert not any(m["type"] == "session.interaction.queued" for m in owner_messages)  # the page's ack was the page's
    assert "steering a session" in page_log, page_log
