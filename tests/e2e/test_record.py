"""`rtvideo record` as a subprocess against a real proxy and Triton: a scheduled update, the
progressive MP4, the raw stream, the timeline, and Ctrl-C."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest

from tests.support.processes import RTVIDEO
from tests.support.streams import (
    PACED_MODEL,
    Transcript,
    check_stream_rules,
    decode,
    wait_for_metric,
)

#: `rtvideo record` with the serving stack made unimportable: it must not need any of it
NO_SERVING_STACK = (
    "import sys\n"
    "for name in ('torch', 'tornado', 'tritonclient', 'grpc'):\n"
    "    sys.modules[name] = None\n"
    "from rtvideo.cli import main\n"
    "sys.exit(main())\n"
)


def record_command(*args: str, block: tuple[str, ...] = ()) -> list[str]:
    if block:
        blocker = "".join(f"sys.modules[{name!r}] = None\n" for name in block)
        return [
            sys.executable,
            "-c",
            NO_SERVING_STACK.replace("from rtvideo.cli", blocker + "from rtvideo.cli"),
            "record",
            *args,
        ]
    return [sys.executable, "-c", NO_SERVING_STACK, "record", *args]


def run_record(*args: str, block: tuple[str, ...] = (), timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`rtvideo record` with `args`, to its end; its exit status and output."""
    return subprocess.run(record_command(*args, block=block), capture_output=True, text=True, timeout=timeout)


def top_level_boxes(data: bytes) -> list[str]:
    boxes, at = [], 0
    while at + 8 <= len(data):
        size = int.from_bytes(data[at : at + 4], "big")
        boxes.append(data[at + 4 : at + 8].decode("ascii"))
        if size == 1:
            size = int.from_bytes(data[at + 8 : at + 16], "big")
        assert size >= 8, boxes
        at += size
    return boxes


def transcript_from(timeline: dict[str, Any], raw: bytes) -> Transcript:
    """The received messages of a timeline, with each payload cut from the raw stream."""
    t, at, pending = Transcript(), 0, None
    for entry in timeline["messages"]:
        if entry["direction"] != "received":
            continue
        if "binary_bytes" in entry:
            assert pending is not None, "a payload without its metadata"
            t.add(pending, raw[at : at + entry["binary_bytes"]])
            at += entry["binary_bytes"]
            pending = None
        elif entry["message"]["type"] == "video.chunk_metadata":
            pending = entry["message"]
        else:
            t.add(entry["message"], b"")
    assert at == len(raw)
    return t


def test_record_with_an_update(proxies, triton, tmp_path: Path) -> None:
    wait_for_metric(triton, "rtvideo_active_sessions", PACED_MODEL, 0)
    out, raw, timeline = tmp_path / "canyon.mp4", tmp_path / "canyon.fmp4", tmp_path / "canyon.json"
    done = run_record(
        "a red desert canyon",
        "--url",
        proxies.url(model=PACED_MODEL),
        "--num-frames",
        "72",
        "--seed",
        "3",
        "--update",
        "1.0:a blue frozen ocean: at night:2",
        *("-o", str(out), "--raw", str(raw), "--timeline", str(timeline)),
    )
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    chunk_lines = [line for line in lines if line.startswith("[chunk")]

    # the progressive MP4: plays, every frame, its duration, no fragments
    data = out.read_bytes()
    boxes = top_level_boxes(data)
    assert "moof" not in boxes and boxes.index("moov") < boxes.index("mdat"), boxes
    with av.open(str(out)) as container:
        stream = container.streams.video[0]
        assert stream.frames == 72 and stream.average_rate == 16
        assert container.duration / 1e6 == pytest.approx(72 / 16, abs=1 / 16)
        assert float(stream.duration * stream.time_base) == pytest.approx(72 / 16, abs=1 / 16)
    assert decode(data).shape == (72, 256, 256, 3)

    # the raw stream and the timeline: every message, in order, with the ack and the event's life
    record = json.loads(timeline.read_text())
    assert "token" not in record["url"]
    t = transcript_from(record, raw.read_bytes())
    check_stream_rules(t)  # and each message matched the published schema
    assert len(chunk_lines) == len(t.pairs) == t.messages[-1]["chunks"]
    assert decode(raw.read_bytes()).shape[0] == 72
    sent = [e for e in record["messages"] if e["direction"] == "sent"]
    assert [e["message"]["type"] for e in sent] == ["session.start", "session.interaction"]
    interaction = sent[1]["message"]["interaction"]
    assert interaction == {
        "event_id": "update-1",
        "event": {"prompt": "a blue frozen ocean: at night"},
        "transition_chunks": 2,
    }
    times = {
        e["message"]["type"]: e["t"]
        for e in record["messages"]
        if "message" in e
        and e["direction"] == "received"
        and e["message"]["type"] in ("video.start", "session.interaction.queued")
    }
    assert sent[1]["t"] - times["video.start"] == pytest.approx(1.0, abs=0.3)  # AT after video.start
    assert times["session.interaction.queued"] >= sent[1]["t"]
    started = [m for m in t.media if "update-1" in m["started_event_ids"]]
    completed = [m for m in t.media if "update-1" in m["completed_event_ids"]]
    assert len(started) == len(completed) == 1
    assert completed[0]["generation_chunk_index"] == started[0]["generation_chunk_index"] + 1  # N = 2

    # the progress lines name the ack (with its latency) and the event's start and completion
    index = {m["transport_chunk_index"]: m for m in t.media}
    ack_line = next(line for line in chunk_lines if "acks=update-1(" in line)
    assert "ms)" in ack_line
    assert any(
        f"[chunk {started[0]['transport_chunk_index']:3d}]" in line and "started=update-1" in line
        for line in chunk_lines
    )
    assert any(
        f"[chunk {completed[0]['transport_chunk_index']:3d}]" in line and "completed=update-1" in line
        for line in chunk_lines
    )
    assert all("lead=" in line for line in chunk_lines if "trailer" not in line) and index


def test_sigint_stops_and_saves_what_arrived(proxies, triton, tmp_path: Path) -> None:
    wait_for_metric(triton, "rtvideo_active_sessions", PACED_MODEL, 0)
    out, timeline = tmp_path / "endless.mp4", tmp_path / "endless.json"
    proc = subprocess.Popen(
        [
            str(RTVIDEO),
            "record",
            "an endless harbour",
            "--url",
            proxies.url(model=PACED_MODEL).rsplit("/v1/", 1)[0],
            "-o",
            str(out),
            "--timeline",
            str(timeline),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + 60
        while sum(line.startswith("[chunk") for line in lines) < 3:
            assert time.monotonic() < deadline, lines
            line = proc.stderr.readline()
            assert line, f"rtvideo record ended early: {lines}"
            lines.append(line)
        proc.send_signal(signal.SIGINT)
        _, rest = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, [*lines, rest]
    record = json.loads(timeline.read_text())
    sent = [e["message"]["type"] for e in record["messages"] if e["direction"] == "sent"]
    assert sent == ["session.start", "session.stop"]
    received = [e["message"] for e in record["messages"] if e["direction"] == "received" and "message" in e]
    done = received[-1]
    assert done["type"] == "session.done" and done["stopped"] is True
    frames = sum(m["num_frames"] for m in received if m["type"] == "video.chunk_metadata")
    assert frames >= 27
    with av.open(str(out)) as container:
        assert container.streams.video[0].frames == frames
        assert container.duration / 1e6 == pytest.approx(frames / 16, abs=1 / 16)
    assert decode(out.read_bytes()).shape[0] == frames
    assert "interrupted: session.stop sent" in "".join(lines) + rest


def test_record_without_pyav_says_how_to_install(tmp_path: Path) -> None:
    done = run_record("x", "--url", "ws://127.0.0.1:9/v1/realtime/video", block=("av",), timeout=60)
    assert done.returncode == 1 and "pip install av" in done.stderr, done.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["x", "--update", "soon:prompt"],
        ["x", "--update", "2:"],
        ["x", "--update", "-1:p"],
        ["x", "--seconds", "2", "--num-frames", "9"],
        [],
    ],
)
def test_record_usage_errors_exit_2(args: list[str]) -> None:
    done = run_record(*args, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr


def test_unreachable_server_exits_1() -> None:
    done = run_record("x", "--url", "ws://127.0.0.1:9", timeout=60)
    assert done.returncode == 1 and "cannot connect" in done.stderr, done.stderr


def test_record_with_a_camera_and_an_image_reference(proxies, triton, tmp_path: Path) -> None:
    """`--image-reference FILE` is the first frame; `--camera AT:JSON` events are sent, acked and
    run to their ends (a velocity replaced by a target back to the start pose)."""
    wait_for_metric(triton, "rtvideo_active_sessions", PACED_MODEL, 0)
    image = np.zeros((64, 96, 3), dtype=np.uint8)
    image[:, :48] = (220, 30, 30)  # red | blue: survives H.264 and a resize
    image[:, 48:] = (30, 30, 220)
    picture = tmp_path / "first.png"
    with av.open(str(picture), "w", format="image2") as container:
        stream = container.add_stream("png")
        stream.width, stream.height, stream.pix_fmt = 96, 64, "rgb24"
        for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
            container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    turn = '{"mode":"velocity","data":{"translation":[0,0,0.05],"rotation":[0,0.0523,0,0.9986]}}'
    home = '{"mode":"target","data":{"translation":[0,0,0],"rotation":[0,0,0,1]}}'
    out, raw, timeline = tmp_path / "cam.mp4", tmp_path / "cam.fmp4", tmp_path / "cam.json"
    done = run_record(
        "a city street with buildings",
        "--url",
        proxies.url(model=PACED_MODEL),
        "--num-frames",
        "54",
        "--seed",
        "4",
        "--image-reference",
        str(picture),
        "--camera",
        f"0.2:{turn}",
        "--camera",
        f"1.4:{home}",
        *("-o", str(out), "--raw", str(raw), "--timeline", str(timeline)),
    )
    assert done.returncode == 0, done.stderr
    record = json.loads(timeline.read_text())
    sent = [e["message"] for e in record["messages"] if e["direction"] == "sent"]
    assert sent[0]["image_reference"]["image_url"].startswith("data:image/png;base64,")
    cameras = [m["interaction"] for m in sent if m["type"] == "session.interaction"]
    assert [c["event_id"] for c in cameras] == ["camera-1", "camera-2"]
    assert cameras[0]["event"] == {"multi_modal_data": {"camera": json.loads(turn)}}
    t = transcript_from(record, raw.read_bytes())
    check_stream_rules(t)
    completed = {eid for m in t.media for eid in m["completed_event_ids"]}
    assert {"camera-1", "camera-2"} <= completed, t.media  # the turn was replaced, the target reached
    frames = decode(raw.read_bytes())
    assert frames.shape == (54, 256, 256, 3)
    first = frames[0].astype(np.int16)
    assert (first[:, :100, 0] - first[:, :100, 2]).mean() > 100  # the image's red half, resized
    assert (first[:, 156:, 2] - first[:, 156:, 0]).mean() > 100  # and its blue half
    assert np.abs(frames[8].astype(np.int16) - first).mean() > 20  # the scene took over in the first chunk


@pytest.mark.parametrize(
    "args",
    [
        ["x", "--camera", "1:{not json"],
        ["x", "--camera", '1:{"mode":"orbit","data":{}}'],
        ["x", "--camera", '1:{"mode":"velocity","data":{"actions":["w"]}}'],
        ["x", "--camera", 'soon:{"mode":"velocity"}'],
        ["x", "--image-reference", "/nonexistent/first.png"],
    ],
)
def test_record_camera_and_image_usage_errors_exit_2(args: list[str]) -> None:
    done = run_record(*args, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr


def test_record_flag_has_the_server_record_it_and_prints_its_token(proxies, triton, tmp_path: Path) -> None:
    """`--record`: the server keeps the session too; the command prints where, with the recording
    token that opens it (the file it names is the same video)."""
    import urllib.request

    wait_for_metric(triton, "rtvideo_active_sessions", PACED_MODEL, 0)
    server = proxies.server(model=PACED_MODEL, recordings=str(tmp_path / "rec"))
    out = tmp_path / "kept.mp4"
    done = run_record("a red desert canyon", "--url", server.url, "--num-frames", "27", "--record", "-o", str(out))
    assert done.returncode == 0, done.stderr
    line = next(line for line in done.stderr.splitlines() if line.startswith("recorded by the server as "))
    link = line.split(": ", 1)[1].split(" ", 1)[0]
    assert "/video.mp4?recording_token=" in link, line
    deadline = time.monotonic() + 30
    while True:  # the recording is closed off the proxy's loop, just after the session
        try:
            with urllib.request.urlopen(link, timeout=10) as response:
                video = response.read()
            break
        except OSError:
            assert time.monotonic() < deadline, link
            time.sleep(0.2)
    assert video[4:8] == b"ftyp" and len(video) > 1000
