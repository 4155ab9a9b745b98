"""The LingBot-World checks of scripts/test_real_engine.sh: vLLM-Omni's camera model, tiny and
random (tests/support/omni_cpu_lingbot.py), on its AR-Diffusion engine with the shipped stepwise
deploy config made CPU-sized, inside Triton's stub, driven through the proxy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.real_engine.served import (
    CHUNK_TIMEOUT,
    Deployment,
    Served,
    finish,
    media,
    png_data_url,
    refused_start,
    run,
)
from tests.support.omni_cpu_lingbot import write_tiny_deploy, write_tiny_lingbot
from tests.support.paths import REPO_ROOT
from tests.support.proxy_client import Ws, is_error, ws
from tests.support.streams import Transcript, check_stream_rules, decode

#: the AR cache's side (the deploy config's `ar_diffusion_width/height`): a multiple of 16
SIDE = 128  # the smallest side `rtvideo serve` takes
FPC = 12  # a 3-frame latent block; the first chunk is 9 frames
FRAMES = 57  # n % 12 == 9: chunks of 9, 12, 12, 12, 12


def deployment(work: Path) -> Deployment:
    deploy = write_tiny_deploy(REPO_ROOT / "deploy/gpu/lingbot_world_stepwise.yaml", work / "lingbot-tiny.yaml", SIDE)
    model = write_tiny_lingbot(work / "tiny-lingbot")
    return Deployment("lingbot", model, SIDE, SIDE, FPC, {"deploy_config": str(deploy)})


def camera(mode: str, translation: list[float]) -> dict[str, Any]:
    return {"camera": {"mode": mode, "data": {"translation": translation, "rotation": [0.0, 0.0, 0.0, 1.0]}}}


def check_rules(served: Served) -> str:
    """The deployed size is the deploy config's cache size; an image is required; a prompt update
    is not a LingBot interaction. Each refused before the engine sees it."""
    seen = []
    image = png_data_url((40, 90, 160), (SIDE, SIDE))
    for start, words in (
        ({}, "image_reference is required by LingBot-World"),
        ({"image_reference": image, "width": 256, "height": 128}, f"renders {SIDE}×{SIDE} only"),
    ):
        answers = run(refused_start(served, start))
        assert is_error("invalid_start")(answers[0]) and words in answers[0]["message"], answers
        assert [a["type"] for a in answers[1:]] == ["session.done"], answers
        seen.append(answers[0]["message"])
    return " | ".join(seen)


def check_camera(served: Served) -> str:
    """A velocity command, then a target, reach LingBot's own camera handler: the engine reports
    each in its chunk lists; a prompt update is refused (no prompt handler) and the session goes on."""

    async def body() -> tuple[Transcript, dict[str, Any]]:
        async with ws(served.url) as conn:
            s = Ws(conn)
            image = png_data_url((40, 90, 160), (SIDE, SIDE))
            begun = await s.start("a street at night", num_frames=FRAMES, seed=1, image_reference=image)
            move = {"event_id": "move", "event": {"multi_modal_data": camera("velocity", [0.0, 0.0, 0.5])}}
            await s.send({"type": "session.interaction", "interaction": move})
            await media(s)
            await s.send(
                {"type": "session.interaction", "interaction": {"event_id": "words", "event": {"prompt": "rain"}}}
            )
            refused = await s.until(lambda m: m["type"] == "error" and m.get("event_id") == "words", CHUNK_TIMEOUT)
            look = {
                "event_id": "look",
                "event": {"multi_modal_data": camera("target", [0.0, 0.5, 1.0])},
                "transition_chunks": 1,
            }
            await s.send({"type": "session.interaction", "interaction": look})
            await s.until(
                lambda m: m["type"] == "video.chunk_metadata" and "look" in m["started_event_ids"], CHUNK_TIMEOUT * 4
            )
            return await finish(s), {"start": begun, "refused": refused}

    t, seen = run(body())
    check_stream_rules(t)
    frames = decode(t.video)
    assert frames.shape == (FRAMES, SIDE, SIDE, 3), frames.shape
    counts = [m["num_frames"] for m in t.media]
    assert counts == [9, 12, 12, 12, 12], counts
    assert seen["refused"]["code"] == "interaction_failed", seen["refused"]
    lists = [
        (m["generation_chunk_index"], m["started_event_ids"], m["active_event_ids"], m["completed_event_ids"])
        for m in t.media
    ]
    assert any("move" in m["active_event_ids"] for m in t.media), lists
    assert any("look" in m["completed_event_ids"] for m in t.media), lists
    done = t.messages[-1]
    assert done["stopped"] is False, done
    return f"chunk frames {counts}; lists (index, started, active, completed): {lists}; prompt: {seen['refused']['message'][:70]}"


CHECKS = [("rules", check_rules), ("camera", check_camera)]
