"""Playhead reports end to end: real Triton (the shipped pacing, render workers), a real proxy,
the Python client reporting from its virtual playhead, and a direct `tritonclient` sequence
whose reports complete flags-only. No timing asserts: what is checked is that reports are
never answered, that the model paces by them (its chunks carry its view of the lead), that
every message still matches the schema, and that the proxy measured the update on screen."""

from __future__ import annotations

import asyncio
import urllib.request

from rtvideo.client.session import RealtimeVideoClient
from rtvideo.client.triton_stream import TritonStreamSession
from tests.support.proxy_host import run
from tests.support.streams import PACED_MODEL, check_server_message


def metric_count(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(f"{name}_count"))


def test_a_reporting_client_is_paced_and_its_update_is_measured_on_screen(proxies) -> None:
    server = proxies.server(model=PACED_MODEL, start_timeout=9.0)  # a proxy of its own: exact counts

    async def body() -> tuple[list[dict], list[str], dict | None]:
        errors: list[str] = []
        async with RealtimeVideoClient(
            server.url, on_error=lambda e: errors.append(e.code), report_playback=0.1
        ) as client:
            await client.start("a lighthouse at dusk", seed=3, num_frames=9 * 14)
            metas: list[dict] = []
            async for chunk in client.chunks():
                metas.append(chunk.metadata)
                if len(metas) == 6:
                    await client.interact("a harbour in fog", event_id="fog", transition_chunks=1)
            await asyncio.sleep(0)
            return metas, errors, client.done

    metas, errors, done = run(body())
    assert errors == []  # no report was answered
    assert done is not None and done["chunks"] == len(metas)
    for meta in metas:
        check_server_message(meta)
    media = [m for m in metas if m["kind"] == "media"]
    leads = [m["playback_lead_seconds"] for m in media if "playback_lead_seconds" in m]
    assert leads, "the model never paced by the reports"
    assert all(lead >= 0 for lead in leads)
    assert any("fog" in m["started_event_ids"] for m in media)
    assert metric_count(server.port, "rtvideo_proxy_reported_lead_seconds") > 0
    assert metric_count(server.port, "rtvideo_proxy_interaction_visible_seconds") == 1


def test_over_triton_a_report_completes_flags_only(triton) -> None:
    """The Triton contract (docs/protocol.md §8): a session.playback request gets no response
    but the flags-only FINAL, which the blocking client does not surface; the stream goes on."""
    with TritonStreamSession(triton.grpc_url, PACED_MODEL) as s:
        s.start("a quiet harbour", seed=5, num_frames=9 * 6)
        replies = []
        for reply in s.until("session.done", 60):
            replies.append(reply)
            if reply.message and reply.message.get("kind") == "media":
                s.send({"type": "session.playback", "position_seconds": 0.0, "buffered_seconds": 0.0})
    messages = [r.message for r in replies if r.message]
    assert not [m for m in messages if m["type"] == "error"], messages
    assert messages[-1]["type"] == "session.done" and messages[-1]["chunks"] >= 6
    for message in messages:
        check_server_message(message)
