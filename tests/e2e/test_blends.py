"""Weighted prompt blends end to end with the built-in generator: a session that starts on a
blend and then moves to another by slerp, through the proxy (the paced model: rendering in
worker processes, so the slerp recipe crosses the worker pipe) and over direct gRPC (the fast
model: rendering in the model's process). Real Triton, real decoding."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest

from rtvideo.client.session import RealtimeVideoClient, RealtimeVideoError
from rtvideo.client.triton_stream import TritonStreamSession
from tests.support.proxy_client import Ws, is_error, ws
from tests.support.proxy_host import run
from tests.support.streams import FAST_MODEL, PACED_MODEL, Transcript, check_stream_rules, decode

START_BLEND = [{"text": "a red lighthouse at sunset", "weight": 3}, {"text": "a snowy forest at night", "weight": 1}]
UPDATE_BLEND = [
    {"text": "a calm blue ocean at noon", "weight": 1},
    {"text": "a neon city street in the rain", "weight": 1},
    {"text": "a campfire in a dark cave", "weight": 2},
]
BUILTIN_INTERACTIONS = {
    "kinds": ["prompt", "blend", "camera"],
    "event_fields": ["prompt", "prompts", "multi_modal_data"],
    "interpolation": ["linear", "slerp"],
}


def blend_interaction(event_id: str, prompts: list[dict[str, Any]], **envelope: Any) -> dict[str, Any]:
    return {
        "type": "session.interaction",
        "interaction": {"event_id": event_id, "event": {"prompts": prompts}, **envelope},
    }


def check_blend_session(t: Transcript, start: dict[str, Any], frames: int) -> None:
    """The start's blend reported, b1 started, active and completed once, nothing left over."""
    check_stream_rules(t)
    config = start["config"]
    assert config["prompts"] == [
        {"text": "a red lighthouse at sunset", "weight": 0.75},
        {"text": "a snowy forest at night", "weight": 0.25},
    ]
    assert config["prompt"] == "a red lighthouse at sunset" and config["interactions"] == BUILTIN_INTERACTIONS
    started = [e for m in t.media for e in m["started_event_ids"]]
    completed = [e for m in t.media for e in m["completed_event_ids"]]
    assert started == ["b1"] and completed == ["b1"]
    first = next(i for i, m in enumerate(t.media) if "b1" in m["started_event_ids"])
    active = [i for i, m in enumerate(t.media) if "b1" in m["active_event_ids"]]
    assert active == [first, first + 1]  # N = 2: started, then completed on the next chunk
    assert t.media[first]["transition_progress"]["b1"] == 0.5
    done = t.messages[-1]
    assert done["unapplied_event_ids"] == [] and done["unfinished_event_ids"] == []
    assert decode(t.video).shape == (frames, 128, 128, 3)


def test_a_blend_session_through_the_proxy(proxies) -> None:
    async def body() -> tuple[dict[str, Any], Transcript, list[dict[str, Any]]]:
        async with ws(proxies.url(model=PACED_MODEL)) as conn:
            s = Ws(conn)
            await s.send(
                {
                    "type": "session.start",
                    "prompts": START_BLEND,
                    "interpolation": "linear",
                    "width": 128,
                    "height": 128,
                    "num_frames": 54,
                    "seed": 4,
                }
            )
            start = await s.next()
            assert start["type"] == "video.start", start
            await s.next_media()
            update = blend_interaction("b1", UPDATE_BLEND, interpolation="slerp", transition_chunks=2)
            await s.send(update)
            await s.send(update)  # a retry: acked again, applied once
            await s.send(blend_interaction("b1", UPDATE_BLEND, interpolation="linear", transition_chunks=2))
            conflict = await s.until(is_error("event_id_conflict"))
            assert conflict["event_id"] == "b1"
            t = await s.finish()
        acks = [m for m in t.messages if m["type"] == "session.interaction.queued"]
        return start, t, acks

    start, t, acks = run(body())
    assert [a["event_id"] for a in acks] == ["b1", "b1"]
    assert start["config"]["interpolation"] == "linear"
    check_blend_session(t, start, 54)


def test_a_blend_session_over_grpc(triton) -> None:
    """The fast (unpaced) model, rendering in the model's process: open-ended, stopped once b1 completed."""
    with TritonStreamSession(triton.grpc_url, FAST_MODEL) as s:
        s.start(None, prompts=START_BLEND, interpolation="slerp", width=128, height=128, seed=4)
        t = Transcript()
        for reply in s.until("video.start", 60):
            t.add(reply.message, reply.data)
        s.interact(event_id="b1", event={"prompts": UPDATE_BLEND}, transition_chunks=2)
        while not any("b1" in m["completed_event_ids"] for m in t.media):
            reply = s.next(60)
            t.add(reply.message, reply.data)
        s.stop()
        for reply in s.until("session.done", 120):
            t.add(reply.message, reply.data)
    start = t.messages[0]
    assert start["config"]["interpolation"] == "slerp"  # the session's default, used by b1
    assert any(m["type"] == "session.interaction.queued" and m["event_id"] == "b1" for m in t.messages)
    assert t.messages[-1]["stopped"] is True
    check_blend_session(t, start, sum(m["num_frames"] for m in t.media))


def test_models_list_the_builtin_interactions(proxies) -> None:
    port = proxies.server().port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=10) as response:
        body = json.loads(response.read())
    assert body["data"] and all(entry["interactions"] == BUILTIN_INTERACTIONS for entry in body["data"])


def test_the_python_client_blends(proxies, tmp_path) -> None:
    async def body() -> tuple[dict[str, Any], dict[str, Any] | None]:
        async with RealtimeVideoClient(proxies.url(model=PACED_MODEL)) as c:
            start = await c.start(None, prompts=[("a red desert canyon", 1), ("a blue frozen ocean", 1)], num_frames=45)
            ack = await c.blend([("fog", 1), ("rain", 3)], interpolation="slerp", transition_chunks=1, event_id="mix")
            assert ack["event_id"] == "mix"
            again = await c.blend(
                [{"text": "fog", "weight": 1}, {"text": "rain", "weight": 3}],
                interpolation="slerp",
                transition_chunks=1,
                event_id="mix",
            )
            assert again == ack  # the same payload in either form: a retry
            with pytest.raises(RealtimeVideoError) as conflict:
                await c.blend([("fog", 1), ("rain", 3)], transition_chunks=1, event_id="mix")
            assert conflict.value.code == "event_id_conflict"
            return start, await c.save_mp4(tmp_path / "out.mp4")

    start, done = run(body())
    assert start["config"]["prompts"] == [
        {"text": "a red desert canyon", "weight": 0.5},
        {"text": "a blue frozen ocean", "weight": 0.5},
    ]
    assert done is not None and done["unapplied_event_ids"] == [] and done["unfinished_event_ids"] == []
    assert decode((tmp_path / "out.mp4").read_bytes()).shape[0] == 45
