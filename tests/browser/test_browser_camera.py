"""The demo page drives the camera: its keys and buttons (through the page's own handlers, from
its URL automation) send velocity and target camera events to a real proxy and Triton, the
timeline follows each to its end, and the recorded video shows the motion.

Unity axes: L turns right (yaw about +Y), so the scene moves left in the picture; "Back to
start" is a target to the start pose, after which the view matches the start view again.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
from pathlib import Path
from urllib.parse import urlencode

import numpy as np

from rtvideo.backend.builtin.generator import BuiltinGenerator
from tests.support.browser import TEXT_OF, TIMELINE_ROWS, drive_page
from tests.support.image_motion import shift
from tests.support.proxy_host import wait_idle
from tests.support.streams import PACED_MODEL, decode

#: the MSE player's recording (every payload, trailer included), base64
RECORDING = """(async () => {
  const bytes = new Uint8Array(await window.rtvideoDemo.session.player.recording().arrayBuffer());
  let text = "";
  for (let i = 0; i < bytes.length; i += 0x8000) text += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(text);
})()"""
CHUNK = 9  # frames per chunk (the model's default)
PROMPT = "a city street with buildings"  # a road with dashes: texture that shows the motion


def horizontal_shift(before: np.ndarray, after: np.ndarray) -> float:
    """Pixels the content moved right from `before` to `after` (phase correlation on the lower
    half, where the road and its dashes are)."""
    half = before.shape[0] // 2
    return shift(before[half:], after[half:])[1]


def chunks_listing(page_log: str, name: str) -> dict[str, int]:
    """Event id -> the generation chunk whose metadata first lists it under `name` (the page's log lines)."""
    found: dict[str, int] = {}
    for line in page_log.splitlines():
        match = re.search(rf"gen=(\d+).*{name}=\[([^\]]*)\]", line)
        if match:
            for event_id in match.group(2).split(","):
                found.setdefault(event_id, int(match.group(1)))
    return found


def test_demo_page_drives_the_camera(demo_proxy, triton, tmp_path: Path) -> None:
    wait_idle(triton, PACED_MODEL)
    shot = tmp_path / "demo-camera.png"
    query = urlencode(
        [
            ("prompt", PROMPT),
            ("autostart", 1),
            ("seed", 4),
            # @N: after the page has received N chunks
            ("camera", "+l@1"),  # hold L: turn right ...
            ("camera", "-l@4"),  # ... release it: the camera holds (a whole chunk of turning between)
            ("camera", "home@6"),  # Back to start: a target to the start pose
            ("stop_after", 9),
        ]
    )
    found = drive_page(
        f"http://127.0.0.1:{demo_proxy.port}/?{query}",
        {
            "summary": TEXT_OF % "summary",
            "log": TEXT_OF % "log",
            "rows": TIMELINE_ROWS,
            "recording": RECORDING,
            "keys": "import(new URL('rtvideo.js', location.href).href).then(m => JSON.stringify("
            "[m.cameraFromKeys(['w', 'd', 'i', 'l']), m.cameraFromKeys(['s', 'a', 'k', 'j'])]))",
        },
        timeout=90,
        screenshot=shot,
    )
    folder = os.environ.get("RTVIDEO_SCREENSHOT_DIR")  # for people to look at, as the demo test keeps its own
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(folder) / shot.name)
    assert found["summary"], "the session did not end in time; the page's log:\n" + found["log"]
    summary = json.loads(found["summary"])
    assert summary["errors"] == [] and summary["video_error"] is None, summary
    assert summary["done"]["stopped"] is True, summary
    acks = summary["acks"]
    assert len(acks) == 3 and all(a.startswith("cam-") for a in acks), summary  # press, release, home
    timeline = {row["event_id"]: row for row in summary["timeline"]}
    cameras = [timeline[a]["camera"] for a in acks]
    assert [c["mode"] for c in cameras] == ["velocity", "velocity", "target"], cameras
    yaw = cameras[0]["data"]["rotation"]
    assert yaw[1] > 0 and abs(yaw[0]) < 1e-9 and cameras[0]["data"]["translation"] == [0, 0, 0], cameras
    assert cameras[2]["data"] == {"translation": [0, 0, 0], "rotation": [0, 0, 0, 1]}, cameras
    assert all(row["end"] is not None and row["ack_ms"] is not None for row in timeline.values()), timeline
    assert timeline[acks[2]]["end"] == "completed", timeline  # the view got back to the start pose
    rows = json.loads(found["rows"])
    assert [row["id"] for row in rows] == acks and all("camera" in row["text"] for row in rows), rows

    # the keys as vLLM-Omni's example client maps them: 0.05 a step, yaw 6 degrees then pitch 4 (q = pitch * yaw)
    for camera, sign in zip(json.loads(found["keys"]), (1, -1), strict=True):
        yaw, pitch = np.radians(6.0 * sign) / 2, np.radians(4.0 * sign) / 2
        expected = [
            np.sin(pitch) * np.cos(yaw),
            np.cos(pitch) * np.sin(yaw),
            np.sin(pitch) * np.sin(yaw),
            np.cos(pitch) * np.cos(yaw),
        ]
        assert camera["mode"] == "velocity" and camera["data"]["translation"] == [0.05 * sign, 0, 0.05 * sign]
        assert np.allclose(camera["data"]["rotation"], expected, atol=1e-12), (camera, expected)

    # the recording: still before the press, moving left while L is held, the start view after home
    frames = decode(base64.b64decode(found["recording"]))
    # event id -> the generation chunk it started / completed in (the page's log)
    started, completed = chunks_listing(found["log"], "started"), chunks_listing(found["log"], "completed")
    assert set(started) == set(acks), found["log"]
    # An event takes effect at the frame its receipt time gives within the chunk that starts it,
    # which may be that chunk's last: the chunk after the press is turning from its first frame on.
    turning = (started[acks[0]] + 1) * CHUNK + CHUNK // 2
    held = started[acks[1]] * CHUNK + CHUNK - 1
    assert turning + 2 < started[acks[1]] * CHUNK, started
    assert horizontal_shift(frames[turning], frames[turning + 1]) < -2.0  # the scene slides left
    assert abs(horizontal_shift(frames[0], frames[1])) < 1.0  # before any camera event: still
    home = completed[acks[2]] * CHUNK + CHUNK  # the chunk after the target reached it: at the start pose
    assert home < len(frames), (home, len(frames))
    # the same session with a fixed camera, rendered here (the generator is deterministic)
    fixed = BuiltinGenerator().open_session(width=256, height=256, seed=4).generate({PROMPT: 1.0}, home + 1)
    away = np.abs(frames[held].astype(np.int16) - fixed[held]).mean()
    back = np.abs(frames[home].astype(np.int16) - fixed[home]).mean()
    still = np.abs(frames[0].astype(np.int16) - fixed[0]).mean()  # what the encoder alone changes
    assert back < still + 2.0 < away, (back, still, away)
