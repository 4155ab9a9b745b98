"""What a vLLM-Omni client meets beyond prompt updates, through the real proxy and Triton:
camera control (`event.multi_modal_data.camera`), a start with `image_reference` and the other
fields of vLLM-Omni's request model, `GET /v1/models` and `/healthz`'s served names.

The session test plays vLLM-Omni's example client
(examples/online_serving/streaming_video_generation/streaming_video_client.py, read from a
fork that carries the 0.30 camera client, wtz2333/vllm-omni@69da5b3: event ids
`scheduled-camera-<at>`, no `transition_chunks` for a velocity unless given, 3 for a target)
as its README runs it with `--image-reference FILE --camera-updates '[{"at": ..., "actions": ["w"]},
{"at": ..., "camera": {...}, "transition_chunks": 2}]'`: the start carries the image as a
`data:` URL in `{"image_url": ...}`; each update becomes a `session.interaction` whose event
is `{"multi_modal_data": {"camera": PAYLOAD}}`, key tokens turned into a structural velocity
delta the way its `camera_utils.wasd_to_camera_payload` turns them (0.05 per step on X/Z, 4°
pitch, 6° yaw). Its receive loop (metadata text, then the binary chunk) is the compat test's.
"""

from __future__ import annotations

import base64
import io
import json
import math
import urllib.error
import urllib.request
from typing import Any

import av
import numpy as np

from tests.support.omni_example_client import play_example_client
from tests.support.proxy_host import run, wait_idle
from tests.support.streams import FAST_MODEL_NAMES, PACED_MODEL, Transcript, check_stream_rules, decode


def wasd_payload(actions: list[str]) -> dict[str, Any]:
    """The structural velocity delta of key tokens: d/a and w/s step X and Z by 0.05, l/j yaw
    6° about +Y, i/k pitch 4° about +X, pitch applied first (R = R_yaw · R_pitch)."""
    keys = {a.lower() for a in actions}
    dx = 0.05 * (("d" in keys) - ("a" in keys))
    dz = 0.05 * (("w" in keys) - ("s" in keys))
    yaw = math.radians(6.0 * (("l" in keys) - ("j" in keys)))
    pitch = math.radians(4.0 * (("i" in keys) - ("k" in keys)))
    cy, sy, cp, sp = math.cos(yaw / 2), math.sin(yaw / 2), math.cos(pitch / 2), math.sin(pitch / 2)
    quat = [cy * sp, sy * cp, -sy * sp, cy * cp]  # q_yaw ⊗ q_pitch
    return {"mode": "velocity", "data": {"translation": [dx, 0.0, dz], "rotation": quat}}


def png_data_url(width: int = 64, height: int = 48) -> str:
    """A small PNG (a horizontal gradient) as the `data:` URL the example client sends."""
    frame = av.VideoFrame.from_ndarray(
        np.tile(np.linspace(0, 255, width, dtype=np.uint8)[None, :, None], (height, 1, 3)), format="rgb24"
    )
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="image2pipe") as container:
        stream = container.add_stream("png")
        stream.width, stream.height, stream.pix_fmt = width, height, "rgb24"
        for packet in stream.encode(frame):
            container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


CAMERA_UPDATES = [
    {"at": 0.0, "actions": ["w"]},
    {
        "at": 0.4,
        "camera": {"mode": "target", "data": {"translation": [0.0, 0.0, 1.0], "rotation": [0.0, 0.0, 0.0, 1.0]}},
        "transition_chunks": 2,
    },
]


def interaction_of(update: dict[str, Any]) -> dict[str, Any]:
    camera = update["camera"] if "camera" in update else wasd_payload(update["actions"])
    # The client's own defaults: no transition_chunks for a velocity, 3 for a target.
    transition_chunks = update.get("transition_chunks", None if camera.get("mode") == "velocity" else 3)
    interaction: dict[str, Any] = {
        "event_id": f"scheduled-camera-{update['at']:.3f}",
        "event": {"multi_modal_data": {"camera": camera}},
    }
    if transition_chunks is not None:
        interaction["transition_chunks"] = transition_chunks
    return {"type": "session.interaction", "interaction": interaction}


async def example_client(url: str, payload: dict[str, Any], updates: list[dict[str, Any]]) -> Transcript:
    """The example client with `--camera-updates`: each update at its time after video.start."""
    return await play_example_client(url, payload, [(update["at"], interaction_of(update)) for update in updates])


def test_the_example_clients_camera_and_image_reference_session(proxies, triton) -> None:
    """Its README's LingBot-World command line (832x480, 33 frames are its recipe; 99 here, its
    default, so that both updates land), with `--model` naming the paced model, the one a
    server ships: real-time pacing, as a live client sees it."""
    start = {
        "type": "session.start",
        "model": PACED_MODEL,
        "prompt": "The camera moves slowly forward through the scene.",
        "width": 832,
        "height": 480,
        "fps": 16,
        "num_frames": 99,
        "guidance_scale": 1.0,
        "seed": 42,
        "image_reference": {"image_url": png_data_url()},
    }
    wait_idle(triton, PACED_MODEL)  # the paced model's few slots: earlier tests' sessions have ended
    t = run(example_client(proxies.url(model=PACED_MODEL), start, CAMERA_UPDATES), 240)
    check_stream_rules(t)
    assert not t.of_type("error"), t.of_type("error")
    ids = [f"scheduled-camera-{u['at']:.3f}" for u in CAMERA_UPDATES]
    assert [m["event_id"] for m in t.of_type("session.interaction.queued")] == ids
    done = t.messages[-1]
    for event_id in ids:  # every camera event reaches one visible end
        ended = any(event_id in m["completed_event_ids"] for m in t.media)
        assert ended or event_id in done["unapplied_event_ids"] + done["unfinished_event_ids"], event_id
    started = [e for m in t.media for e in m["started_event_ids"]]
    assert started == ids  # a paced stream of 6 s: both land
    (replacing,) = [m for m in t.media if ids[1] in m["started_event_ids"]]
    assert ids[0] in replacing["completed_event_ids"]  # the target replaced the held velocity
    assert t.messages[0]["config"]["ignored_fields"] == ["guidance_scale"]
    frames = decode(t.video)
    assert frames.shape == (99, 480, 832, 3)


def get(url: str, token: str | None = None) -> tuple[int, Any]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, None


#: what a start may name on the test session's fast model: its served names, then `rtvideo-<generator>`
SERVED = [*FAST_MODEL_NAMES, "rtvideo-builtin"]


def test_models_and_healthz_name_the_served_models(proxies) -> None:
    server = proxies.server()
    base = f"http://127.0.0.1:{server.port}"
    status, body = get(base + "/v1/models")
    assert status == 200 and body["object"] == "list"
    assert [m["id"] for m in body["data"]] == SERVED
    assert all(m["object"] == "model" and isinstance(m["created"], int) for m in body["data"])
    status, health = get(base + "/healthz")
    assert status == 200 and health["served_model_names"] == SERVED
    locked = proxies.server(token="s3cret-token")
    locked_base = f"http://127.0.0.1:{locked.port}"
    assert get(locked_base + "/v1/models")[0] == 401
    status, body = get(locked_base + "/v1/models", token="s3cret-token")
    assert status == 200 and [m["id"] for m in body["data"]] == SERVED
    status, health = get(locked_base + "/healthz")
    assert status == 200 and "served_model_names" not in health  # only the status without the token


def test_the_rest_of_the_request_model_is_accepted_and_reported(proxies) -> None:
    """`lora`, `user`, `quality` (what a new user tried) and a camera-only event on the built-in
    generator: accepted; the start's fields the generator does not use are config.ignored_fields."""
    start = {
        "type": "session.start",
        "prompt": "a lighthouse at dusk",
        "num_frames": 18,
        "lora": {"name": "style", "path": "/loras/style"},
        "user": "user-42",
        "quality": "high",
    }
    t = run(example_client(proxies.url(), start, []), 120)
    check_stream_rules(t)
    assert not t.of_type("error")
    assert t.messages[0]["config"]["ignored_fields"] == ["lora", "quality", "user"]
