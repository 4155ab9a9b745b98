"""generator=vllm_omni end to end, without a GPU: a real tritonserver hosts the model with the
STAND-IN engine (`tests/support/omni_standin.py`, named by the `vllm_omni_engine` parameter),
and real WebSocket clients talk to it through the real proxy.

The stand-in applies interactions with vLLM-Omni's real prompt handler and records every
call it gets in a JSON-lines file, so the tests see what reached the engine and when.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus

from rtvideo.backend.vllm_omni.model_rules import HELIOS_DISTILLED, LINGBOT_WORLD
from rtvideo.backend.vllm_omni.presets import DEFAULT_MAX_REQUEST_FRAMES
from tests.support.omni_standin import colour
from tests.support.omni_triton import (
    DYING,
    FPC,
    HELIOS_BASE,
    LINGBOT,
    MODEL,
    NO_PROMPT,
    PIXEL,
    PRESET,
    Engine,
    H,
    W,
)
from tests.support.paths import STANDIN_ENGINE
from tests.support.proxy_client import Ws, is_error, ws
from tests.support.proxy_host import run
from tests.support.streams import Transcript, check_stream_rules, decode


def frames_colour(t: Transcript, chunk: int) -> np.ndarray:
    counts = [m["num_frames"] for m in t.media]
    frames = decode(t.video)
    start = sum(counts[:chunk])
    return frames[start : start + counts[chunk]].reshape(-1, 3).mean(axis=0)


def test_updates_before_and_after_the_first_output_then_stop(omni) -> None:
    proxies, engines = omni
    engine = engines[MODEL]

    async def body() -> tuple[Transcript, str]:
        async with ws(proxies.url(model=MODEL)) as conn:
            s = Ws(conn)
            start = await s.start("a harbour", seed=11)
            assert start["config"]["frames_per_chunk"] == FPC and start["config"]["width"] == W
            await s.interact("early lanterns", "early", 0)  # the engine has produced nothing yet
            await s.until(lambda m: m.get("event_id") == "early" and m["type"] == "session.interaction.queued")
            first = await s.next_media()
            assert first["started_event_ids"] == []  # held, not lost: it starts at a later boundary
            await s.until(lambda m: m["type"] == "video.chunk_metadata" and "early" in m["completed_event_ids"])
            await s.interact("late snow", "late", 2)
            await s.until(lambda m: m["type"] == "video.chunk_metadata" and "late" in m["completed_event_ids"])
            await s.next_media()
            await s.send({"type": "session.stop"})
            return await s.finish(), start["request_id"]

    t, request_id = run(body())
    check_stream_rules(t)
    done = t.messages[-1]
    assert done["stopped"] is True and done["unapplied_event_ids"] == [] and done["unfinished_event_ids"] == []
    assert t.pairs[-1][0]["kind"] == "trailer"
    # what reached the engine: the session's values, the preset, and no interaction before admission
    generate = engine.wait_for("generate", request_id=request_id)
    assert (generate["width"], generate["height"], generate["fps"], generate["seed"]) == (W, H, 16, 11)
    assert generate["extra_args"] == PRESET and generate["guidance_scale"] == 1.0  # Helios-Distilled's preset
    config = t.messages[0]["config"]  # no length: the length cap, never an hour of frames
    assert generate["num_frames"] == config["num_frames"] == DEFAULT_MAX_REQUEST_FRAMES
    assert config["ignored_fields"] == [] and config["sampling"] == {"guidance_scale": 1.0, "extra_params": PRESET}
    submits = engine.calls("submit", request_id=request_id)
    assert [(c["event_id"], c["transition_chunks"]) for c in submits] == [("early", 0), ("late", 2)]
    # each forwarded once the engine had admitted the request (its start notice), never before
    assert engine.wait_for("start_notice", request_id=request_id)["t"] < submits[0]["t"]
    assert submits[1]["before_first_output"] is False
    # the transition as the wire says it: N = 2 reaches the target in the second affected chunk
    late = [m for m in t.media if "late" in m["active_event_ids"]]
    assert [m["transition_progress"]["late"] for m in late] == [0.5, 1.0]
    assert late[0]["started_event_ids"] == ["late"] and late[1]["completed_event_ids"] == ["late"]
    # the engine rendered the blend it said it did
    last = len(t.media) - 1
    assert np.abs(frames_colour(t, last) - colour("late snow").numpy() * 255).max() < 6
    # the stop ended the engine request before its last frame
    engine.wait_for("abort", request_id=request_id)


def test_bounded_session_carries_exactly_its_frames(omni) -> None:
    proxies, _ = omni

    async def body() -> Transcript:
        async with ws(proxies.url(model=MODEL)) as conn:
            s = Ws(conn)
            await s.start("a field", num_frames=10)
            return await s.finish()

    t = run(body())
    check_stream_rules(t)
    assert [m["num_frames"] for m in t.media] == [4, 4, 2]
    assert decode(t.video).shape == (10, H, W, 3) and t.messages[-1]["stopped"] is False


def test_client_disconnect_aborts_the_engine_request(omni) -> None:
    proxies, engines = omni

    async def body() -> str:
        async with ws(proxies.url(model=MODEL)) as conn:
            s = Ws(conn)
            start = await s.start("a road")
            await s.next_media()
            return start["request_id"]  # leaving the block closes the connection mid-stream

    request_id = run(body())
    engines[MODEL].wait_for("abort", request_id=request_id)


def test_engine_error_on_one_event_is_interaction_failed_and_the_session_goes_on(omni) -> None:
    """An interaction the engine would refuse (here: a prompt update for a pipeline that has no
    prompt handler in vLLM-Omni's registry) is refused before it is forwarded: the engine would
    raise it inside `generate()` and abort the request. So it is `interaction_failed` and the
    session goes on."""
    proxies, engines = omni

    async def body() -> tuple[Transcript, str]:
        async with ws(proxies.url(model=NO_PROMPT)) as conn:
            s = Ws(conn)
            start = await s.start("a bridge")
            await s.next_media()
            await s.interact("a new prompt", "bad")
            error = await s.until(is_error("interaction_failed"))
            assert error["event_id"] == "bad" and "not supported by pipeline 'WanPipeline'" in error["message"]
            await s.next_media()
            await s.next_media()  # the session goes on
            await s.send({"type": "session.stop"})
            return await s.finish(), start["request_id"]

    t, request_id = run(body())
    check_stream_rules(t)
    named = {
        e
        for m in t.media
        for key in (
            "started_event_ids",
            "active_event_ids",
            "completed_event_ids",
            "superseded_event_ids",
            "interrupted_event_ids",
        )
        for e in m[key]
    }
    done = t.messages[-1]
    assert done["stopped"] is True and t.pairs[-1][0]["kind"] == "trailer"
    assert "bad" not in named and "bad" not in done["unapplied_event_ids"] + done["unfinished_event_ids"]
    engine = engines[NO_PROMPT]
    assert engine.calls("submit", request_id=request_id) == []  # it never reached the engine
    assert engine.calls("engine_abort", request_id=request_id) == []


def test_a_blend_or_slerp_is_acked_then_interaction_failed_and_never_forwarded(omni) -> None:
    """vLLM-Omni 0.30's engine takes only `prompt` and interpolates linearly: a blend (or slerp)
    is acked, then `interaction_failed` naming the field; a plain prompt still reaches the
    engine as before, and a start with `prompts` is `invalid_start` naming it."""
    proxies, engines = omni
    blend = [{"text": "a reef", "weight": 1}, {"text": "a desert", "weight": 2}]

    async def body() -> tuple[Transcript, dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
        async with ws(proxies.url(model=MODEL)) as conn:
            s = Ws(conn)
            await s.send({"type": "session.start", "prompts": blend})
            refused = await s.next()
        async with ws(proxies.url(model=MODEL)) as conn:
            s = Ws(conn)
            start = await s.start("a bridge")
            await s.next_media()
            interaction = {"event_id": "blend", "event": {"prompts": blend}}
            await s.send({"type": "session.interaction", "interaction": interaction})
            slerp = {"event_id": "slerp", "event": {"prompt": "fog"}, "interpolation": "slerp"}
            await s.send({"type": "session.interaction", "interaction": slerp})
            failures = [await s.until(is_error("interaction_failed")), await s.until(is_error("interaction_failed"))]
            await s.interact("a plain prompt", "plain", 1)
            await s.until(lambda m: m["type"] == "video.chunk_metadata" and "plain" in m["completed_event_ids"])
            await s.send({"type": "session.stop"})
            return await s.finish(), start, failures, refused

    t, start, failures, refused = run(body())
    assert refused["code"] == "invalid_start" and refused["message"].startswith("prompts")
    check_stream_rules(t)
    assert start["config"]["interactions"] == {
        "kinds": ["prompt"],
        "event_fields": ["prompt", "multi_modal_data"],
        "interpolation": ["linear"],
    }
    acked = [m["event_id"] for m in t.of_type("session.interaction.queued")]
    assert acked == ["blend", "slerp", "plain"]
    by_id = {f["event_id"]: f["message"] for f in failures}
    assert "event field(s) prompts not supported" in by_id["blend"]
    assert "interpolation 'slerp'" in by_id["slerp"]
    named = {e for m in t.media for e in m["started_event_ids"] + m["active_event_ids"]}
    assert "blend" not in named and "slerp" not in named and "plain" in named
    sent = engines[MODEL].calls("submit", request_id=start["request_id"])
    assert [(c["event_id"], c["prompt"], c["transition_chunks"]) for c in sent] == [("plain", "a plain prompt", 1)]


def test_a_refusal_only_the_engine_detects_ends_the_session_naming_the_event(omni) -> None:
    """The engine's worker refuses an event it has queued (here the pipeline cannot encode the
    prompt): as in vLLM-Omni, the error is raised inside `generate()`, which aborts the request.
    The session ends with `generation_failed` naming the event, and `session.done` accounts for it."""
    proxies, engines = omni

    async def body() -> tuple[Transcript, str]:
        async with ws(proxies.url(model=MODEL)) as conn:
            s = Ws(conn)
            start = await s.start("a bridge")
            await s.next_media()
            await s.interact("stand-in: refuse this", "bad")
            error = await s.until(is_error("generation_failed"))
            assert "'bad'" in error["message"] and "Failed interaction" in error["message"]
            return await s.finish(), start["request_id"]

    t, request_id = run(body())
    check_stream_rules(t)
    done = t.messages[-1]
    assert done["type"] == "session.done" and done["unapplied_event_ids"] == ["bad"]
    engine = engines[MODEL]
    assert engine.wait_for("refused", request_id=request_id)["event_id"] == "bad"
    engine.wait_for("engine_abort", request_id=request_id)


def readyz(url: str) -> int:
    try:
        return urllib.request.urlopen(
            url.replace("ws://", "http://").replace("/v1/realtime/video", "/readyz"), timeout=5
        ).status
    except urllib.error.HTTPError as exc:
        return exc.code


def eventually(check: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline
        time.sleep(0.1)


def test_engine_death_ends_sessions_and_makes_the_model_unready(omni) -> None:
    proxies, _engines = omni
    url = proxies.url(model=DYING, probe_interval=0.3, probe_failures=2)
    eventually(lambda: readyz(url) == 200, 15)

    async def body() -> Transcript:
        async with ws(url) as conn:
            s = Ws(conn)
            await s.start("a quiet street")
            await s.next_media()
            await s.interact("stand-in: die", "fatal")
            error = await s.until(is_error("generation_failed"), timeout=15)
            assert "engine" in error["message"]
            return await s.finish()

    t = run(body())
    assert t.messages[-1]["type"] == "session.done" and t.pairs[-1][0]["kind"] == "media"  # no trailer after an error
    # the model refuses the health probe from now on: the proxy takes it for down
    eventually(lambda: readyz(url) == 503, 15)

    async def refused() -> None:
        with pytest.raises((InvalidStatus, ConnectionClosed)):
            async with ws(url) as conn:
                await Ws(conn).start("anyone there?")

    run(refused())


def test_finalize_aborts_shuts_the_engine_down_and_stops_the_loop(tmp_path) -> None:
    """What the model's finalize() does (`SessionManager.shutdown`), in this process: tritonserver
    may exit before it finalizes a model that served sessions (its exit timeout), whatever the
    generator, so the end of a real server does not show it reliably."""
    import threading

    from rtvideo.backend.loading.assembly import build_manager
    from rtvideo.backend.loading.settings import BackendSettings
    from tests.support.recorder import Recorder

    engine = Engine(tmp_path / "calls.jsonl")
    settings = BackendSettings(
        generator="vllm_omni",
        width=W,
        height=H,
        frames_per_chunk=FPC,
        pacing_lead_chunks=None,
        vllm_omni_engine=STANDIN_ENGINE,
        vllm_omni_engine_args=json.dumps({"record": str(engine.record), "frames_per_chunk": FPC}),
    )
    manager = build_manager(settings, "realtime_video")
    channel = Recorder()
    manager.on_request(
        1,
        b'{"type": "session.start", "prompt": "p"}',
        start=True,
        end=False,
        channel=channel,
        secret="vllm-omni-test-session-secret",
    )
    deadline = time.monotonic() + 15
    while "video.chunk_metadata" not in channel.types():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    request_id = channel.sent[0][0]["request_id"]
    manager.shutdown()
    assert channel.finished.wait(5)
    assert [m["code"] for m, _, _ in channel.sent if m and m["type"] == "error"] == ["backend_unavailable"]
    engine.wait_for("abort", request_id=request_id)
    engine.wait_for("shutdown")
    assert not [t for t in threading.enumerate() if t.name == "vllm-omni-loop"], "the engine's loop thread ended"


@pytest.mark.parametrize(
    "model,fields,words",
    [
        (LINGBOT, {"width": 640, "height": 384}, "LingBot-World renders 832×480 only, not 640×384"),
        (LINGBOT, {"drop_image": True}, "image_reference is required by LingBot-World (its first frame)"),
        (LINGBOT, {"num_inference_steps": 8}, "LingBot-World runs exactly 4 inference steps, not 8"),
        (
            MODEL,
            {"width": 832, "height": 480},
            "Helios-Distilled: height 480 is not supported: use a multiple of 64 from 128 to 1280 (e.g. 128×128)",
        ),
        (
            HELIOS_BASE,
            {"width": 200, "height": 128},
            "Helios: width 200 is not supported: use a multiple of 16 from 128 to 1280 (e.g. 128×128)",
        ),
        (HELIOS_BASE, {"fps": 30}, "Helios: fps 30 is not supported: use 1 to 24"),
        (
            MODEL,
            {"extra_params": {"pyramid_num_inference_steps_list": [1, 1]}},
            "Helios-Distilled: pyramid_num_inference_steps_list needs one step count per stage (3), not [1, 1]",
        ),
    ],
)
def test_a_start_that_breaks_a_models_rules_is_refused_before_video_start(omni, model, fields, words) -> None:
    """Through the proxy and over direct gRPC: `invalid_start` naming the rule, no `video.start`,
    and nothing reaches the engine (the pipeline would have refused it after `video.start`)."""
    from client.triton_stream import TritonStreamSession

    proxies, engines = omni
    start: dict[str, Any] = {"image_reference": {"image_url": PIXEL}, **fields}
    if start.pop("drop_image", False):
        del start["image_reference"]
    generated = len(engines[model].calls("generate"))

    async def body() -> dict[str, Any]:
        async with ws(proxies.url(model=model)) as conn:
            s = Ws(conn)
            await s.send({"type": "session.start", "prompt": "a street", **start})
            return await s.next()

    refused = run(body())
    assert refused["type"] == "error" and refused["code"] == "invalid_start" and refused["message"] == words
    stream = TritonStreamSession(proxies.triton_url, model=model)
    try:
        stream.start("a street", **start)
        reply = stream.next()
        assert reply.message is not None and reply.message["type"] == "error", reply
        assert reply.message["code"] == "invalid_start" and reply.message["message"] == words
    finally:
        stream.close()
    assert len(engines[model].calls("generate")) == generated


def test_a_lingbot_session_by_its_rules_reaches_the_engine_with_a_count_it_runs(omni) -> None:
    proxies, engines = omni

    async def body() -> tuple[dict[str, Any], Transcript]:
        async with ws(proxies.url(model=LINGBOT)) as conn:
            s = Ws(conn)
            start = await s.start("a street", num_frames=20, image_reference={"image_url": PIXEL})
            return start, await s.finish()

    start, transcript = run(body())
    check_stream_rules(transcript)
    # the pipeline's chunks: 9 frames (its opening latent decodes to one), then 12, cut to the session's 20
    assert [m["num_frames"] for m in transcript.media] == [9, 11]
    assert transcript.of_type("session.done")[0]["stopped"] is False
    rules = start["config"]["model_rules"]
    assert rules["sizes"] == [[832, 480]] and rules["interactions"] == ["camera"]
    assert rules["image_reference"] == "required" and rules["num_inference_steps"] == 4
    assert start["config"]["sampling"]["num_inference_steps"] == 4
    generate = engines[LINGBOT].wait_for("generate", request_id=start["request_id"])
    assert generate["num_frames"] == 21  # 20 covered by the smallest count with n % 12 == 9
    assert generate["num_inference_steps"] == 4 and generate["image_shape"] == [480, 832, 3]


def test_models_lists_each_models_rules(omni) -> None:
    proxies, _ = omni
    for model, expected in ((LINGBOT, LINGBOT_WORLD), (MODEL, HELIOS_DISTILLED)):
        port = proxies.server(model=model).port
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=10) as response:
            body = json.loads(response.read())
        assert body["data"][0]["id"] == model
        assert all(entry["model_rules"] == expected.describe() for entry in body["data"])


# --- randomised steering: the chunk-list invariants on every chunk (docs/protocol.md §6) ----------
@pytest.mark.parametrize(
    "model,kinds,seed",
    [(MODEL, ("prompt",), 11), (LINGBOT, ("target", "velocity", "home"), 12)],
)
def test_random_steering_through_the_proxy_and_over_grpc(omni, model, kinds, seed) -> None:
    """Helios-Distilled's prompt updates (translated from the engine's metadata) and LingBot-World's
    camera events (the engine's own lists, passed through), each through the proxy and over direct
    gRPC: every chunk obeys the lifetimes, every acked event reaches exactly one end."""
    from client.triton_stream import TritonStreamSession
    from tests.support.steering_script import check_steered, random_script, run_over_grpc, run_through_proxy

    proxies, _ = omni
    start: dict[str, Any] = {"num_frames": 9 + 12 * 12} if model == LINGBOT else {"num_frames": 40 * FPC}
    if model == LINGBOT:
        start["image_reference"] = {"image_url": PIXEL}
    script = random_script(seed, kinds, steps=10, max_delay=0.1)

    async def body() -> Transcript:
        async with ws(proxies.url(model=model)) as conn:
            s = Ws(conn)
            await s.start("a street", **start)
            return await run_through_proxy(s, script, settle=1.0)

    through_proxy = check_steered(run(body()), script)
    stream = TritonStreamSession(proxies.triton_url, model=model)
    try:
        stream.start("a street", **start)
        grpc_script = random_script(seed + 100, kinds, steps=10, max_delay=0.1)
        over_grpc = check_steered(run_over_grpc(stream, grpc_script, settle=1.0), grpc_script)
    finally:
        stream.close()
    assert through_proxy["chunks"] >= 2 and over_grpc["chunks"] >= 2, (through_proxy, over_grpc)


def test_codec_options_configure_our_encoder_and_quality_reaches_the_engine(omni) -> None:
    """A start written for vLLM-Omni's endpoint through the proxy and Triton: its
    `video_codec_options` keyframe interval shows in the decoded stream (a keyframe every 2
    frames, chunks of 4), `threads` is listed as ignored, neither reaches the engine's
    `extra_args`; its `quality` reaches the engine request."""
    import io

    import av

    proxies, engines = omni
    engine = engines[MODEL]
    codec = {"g": "2", "crf": 30, "threads": "0", "tune": "zerolatency"}

    async def body() -> tuple[Transcript, dict[str, Any]]:
        async with ws(proxies.url(model=MODEL)) as conn:
            s = Ws(conn)
            start = await s.start("a field", num_frames=8, quality="high", extra_params={"video_codec_options": codec})
            return await s.finish(), start

    t, start = run(body())
    check_stream_rules(t)
    config = start["config"]
    assert config["ignored_fields"] == ["extra_params.video_codec_options.threads"]
    assert "video_codec_options" not in config["sampling"]["extra_params"] and config["sampling"]["quality"] == "high"
    with av.open(io.BytesIO(t.video), mode="r", format="mp4") as container:
        keys = [i for i, frame in enumerate(container.decode(video=0)) if frame.key_frame]
    assert keys == [0, 2, 4, 6]
    generate = engine.wait_for("generate", request_id=start["request_id"])
    assert generate["extra_args"] == PRESET  # the preset alone: the codec options stayed here
    assert generate["quality"] == "high"
