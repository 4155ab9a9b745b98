"""Sessions as data, end to end: a session driven through the real Triton model is recorded in
the documented format (docs/recordings.md) from what was sent and received; `rtvideo replay`
re-generates it in process, and a start with `rebuild` resumes it at chunk N on Triton.

- replay: raw frames bit-identical with an in-process straight run of the same events (admitted
  live, placed by receipt time), and the decoded MP4 within PSNR 45 dB of the recorded one;
- rebuild over direct gRPC: chunk N of the new stream decodes to the recorded chunk N's frames.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from rtvideo import cli
from rtvideo.backend import catalog
from rtvideo.backend.builtin.generator import BuiltinGenerator
from rtvideo.backend.media.encoder import FragmentedMp4Encoder
from rtvideo.backend.replay.regenerate import FrameRenderer, ReplayError, load_recording, replay_frames, session_config
from rtvideo.backend.runtime.sources import GeneratorChunkSource
from rtvideo.client.recording import recording_line
from rtvideo.client.triton_stream import TritonStreamSession
from rtvideo.core.interaction.types import Interaction
from rtvideo.core.session_log import SessionLog, parse_lines, read_log
from rtvideo.proxy.recordings import ids
from rtvideo.proxy.recordings.store import TOKEN_DIGEST, token_digest
from tests.support.streams import FAST_MODEL, PACED_MODEL, Transcript, decode, split_chunks

CHUNKS = 12
RTVIDEO = Path(sys.executable).with_name("rtvideo")
CAMERA = {"multi_modal_data": {"camera": {"mode": "target", "data": {"translation": [0.5, 0.1, 0.3]}}}}


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


class Recording:
    """What the proxy's recorder writes, built from one direct-gRPC session."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.lines: list[dict[str, Any]] = []
        self.video = bytearray()
        self.transcript = Transcript()

    def sent(self, message: dict[str, Any]) -> None:
        self.lines.append({"t": time.monotonic() - self.t0, "dir": "in", "participant": "owner", "message": message})

    def received(self, message: dict[str, Any] | None, data: bytes) -> None:
        if message is None:
            return
        self.transcript.add(message, data)
        self.lines.append({"t": time.monotonic() - self.t0, "dir": "out", "message": message})
        self.video += data

    def write(self, folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "events.jsonl").write_text("".join(json.dumps(line) + "\n" for line in self.lines))
        (folder / "video.mp4").write_bytes(bytes(self.video))
        return folder


def record_session(triton: Any, folder: Path) -> Recording:
    """A paced session (render workers) with two prompt updates and a camera move sent mid-chunk;
    no seed: the random one the model drew must be pinned by the log."""
    rec = Recording()
    with TritonStreamSession(triton.grpc_url, PACED_MODEL) as s:

        def send(message: dict[str, Any], **flags: Any) -> None:
            rec.sent(message)
            s.send(message, **flags)

        def media() -> dict[str, Any]:
            while True:
                reply = s.next(30)
                rec.received(reply.message, reply.data)
                if reply.message and reply.message.get("type") == "video.chunk_metadata":
                    return reply.message

        send({"type": "session.start", "prompt": "A quiet harbour at dawn", "width": 96, "height": 64}, start=True)
        interactions = {
            1: {"event_id": "p1", "event": {"prompt": "A snowy street at night"}},
            4: {"event_id": "c1", "event": CAMERA, "transition_chunks": 2},
            5: {"event_id": "p2", "event": {"prompt": "A red lighthouse at sunset"}, "transition_chunks": 1},
        }
        for _index in range(CHUNKS):
            meta = media()
            body = interactions.get(meta["generation_chunk_index"])
            if body is not None:
                if "multi_modal_data" in body["event"]:
                    time.sleep(0.25)  # about frame 4 of the next chunk
                send({"type": "session.interaction", "interaction": body})
        send({"type": "session.stop"}, end=True)
        for reply in s.until("session.done", 60):
            rec.received(reply.message, reply.data)
    rec.write(folder)
    return rec


def straight_frames(log: SessionLog, generator: BuiltinGenerator) -> list[np.ndarray]:
    """The recorded events admitted live between boundaries, each received where the log says it
    took effect (a chunk's boundary at time = its index): the path a live session takes."""
    config = session_config(log)
    now = [0.0]
    renderer = FrameRenderer(
        generator.open_session(width=config.width, height=config.height, seed=config.seed, fps=config.fps)
    )
    source = GeneratorChunkSource(renderer, config, clock=lambda: now[0])
    frames = []
    for index in sorted(log.chunk_frames):
        for event in log.events:
            if event.chunk == index:
                received = (index - 1) + (event.frame_offset + 0.5) / config.fps
                source.admit_event(
                    Interaction.admitted(
                        event.request,
                        event.event_id,
                        prompt_default=config.default_transition_chunks,
                        received_at=received,
                        interpolation_default=config.interpolation,
                    )
                )
        now[0] = float(index)
        source.next_chunk(log.chunk_frames[index])
        assert renderer.last is not None
        frames.append(renderer.last)
    source.close()
    return frames


@pytest.fixture(scope="module")
def generator() -> Iterator[BuiltinGenerator]:
    """On one torch thread, as the model renders (`torch_threads` 1): the prompt embeddings differ
    in their last bits with another count."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield BuiltinGenerator(device="cpu", fps=16)
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def recorded(triton: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Recording, SessionLog]:
    folder = tmp_path_factory.mktemp("recording")
    rec = record_session(triton, folder)
    log = read_log(parse_lines((folder / "events.jsonl").read_text()))
    return folder, rec, log


def test_the_recording_holds_where_every_event_took_effect(recorded: Any) -> None:
    _, rec, log = recorded
    assert [e.event_id for e in log.events] == ["p1", "c1", "p2"]
    camera = log.events[1]
    assert camera.frame_offset > 0, "the camera move was meant to land mid-chunk"
    assert log.start_message()["seed"] == rec.transcript.messages[0]["config"]["seed"]


def test_replay_is_the_recorded_session(recorded: Any, generator: BuiltinGenerator, tmp_path: Path) -> None:
    folder, rec, log = recorded
    replayed = [chunk.frames for chunk in replay_frames(log, generator)]
    straight = straight_frames(log, generator)
    assert len(replayed) == len(straight) == log.chunks >= CHUNKS
    for index, (a, b) in enumerate(zip(replayed, straight, strict=True)):
        assert np.array_equal(a, b), f"raw frames of chunk {index} differ"

    out = tmp_path / "replay.mp4"
    subprocess.run([str(RTVIDEO), "replay", str(folder), "-o", str(out)], check=True, timeout=300)
    ours, theirs = decode(out.read_bytes()), decode(bytes(rec.video))
    assert ours.shape == theirs.shape and len(ours) == log.frames
    worst = min(psnr(a, b) for a, b in zip(ours, theirs, strict=True))
    assert worst >= 45, worst
    # the model's encoder is deterministic here: the replay's MP4 is the recorded one, byte for byte
    assert out.read_bytes() == bytes(rec.video)


def test_replay_refuses_another_generators_recording(recorded: Any, tmp_path: Path, capsys: Any) -> None:
    folder, _rec, _ = recorded
    lines = [json.loads(line) for line in (folder / "events.jsonl").read_text().splitlines()]
    for line in lines:
        if line["message"]["type"] == "video.start":
            line["message"]["config"]["sampling"] = {"num_inference_steps": 4}
    other = tmp_path / "other"
    other.mkdir()
    (other / "events.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert cli.main(["replay", str(other), "-o", str(tmp_path / "x.mp4")]) == 1  # refused before loading anything
    assert "generator other than the built-in one" in capsys.readouterr().err
    assert not (tmp_path / "x.mp4").exists()


def test_replay_takes_every_recording_url_the_product_prints(
    proxies: Any, recorded: Any, generator: BuiltinGenerator, tmp_path: Path
) -> None:
    """The recording served by a real proxy (with a client token): `rtvideo replay` takes the
    URL `rtvideo record --record` prints (`.../video.mp4?recording_token=`), the manifest's
    URL with its token in the query, the recordings page's links (`?token=&recording_token=`),
    a trailing slash, and the bare URL with --recording-token; each fetches the same log, and
    the printed one replays to the recorded video. A URL that names no recording is refused
    without quoting its tokens."""
    folder, rec, log = recorded
    rid, key, client = ids.new_id(), "rk1.replay-" + ids.new_id(), "replay-client-token"
    store = tmp_path / "rec"
    shutil.copytree(folder, store / rid)
    manifest = {"recording_id": rid, "status": "complete", "config": log.config, TOKEN_DIGEST: token_digest(key)}
    (store / rid / "manifest.json").write_text(json.dumps(manifest))
    ws = proxies.url(recordings=str(store), token=client)
    printed = recording_line({"recording_id": rid, "recording_token": key}, ws)  # what `rtvideo record` says
    assert printed is not None
    video_url = printed.split(": ", 1)[1].split(" ", 1)[0]
    base = video_url.split("/video.mp4")[0]
    assert video_url == f"{base}/video.mp4?recording_token={key}"
    forms = {
        video_url: {"token": client},
        f"{base}?recording_token={key}": {"token": client},
        f"{base}/events.jsonl?recording_token={key}": {"token": client},
        f"{base}/video.mp4?token={client}&recording_token={key}": {},  # the recordings page's link
        f"{base}/": {"token": client, "recording_token": key},
        base: {"token": client, "recording_token": key},
    }
    for url, given in forms.items():
        got_manifest, got = load_recording(url, **given)
        assert got_manifest is not None and got_manifest["recording_id"] == rid, url
        assert got.events == log.events and got.chunk_frames == log.chunk_frames, url

    out = tmp_path / "again.mp4"
    assert cli.main(["replay", video_url, "--token", client, "-o", str(out)]) == 0
    assert out.read_bytes() == bytes(rec.video)

    with pytest.raises(ReplayError, match="not a recording URL") as refused:
        load_recording(f"{base}/manifest.json?recording_token={key}", token=client)
    assert key not in str(refused.value)


@pytest.mark.parametrize("model", [PACED_MODEL, FAST_MODEL])  # render workers, and in the model's process
@pytest.mark.parametrize("at", [3, 6])  # during the first transition; the camera move in progress
def test_a_rebuilt_start_continues_at_chunk_n(
    triton: Any, recorded: Any, generator: BuiltinGenerator, model: str, at: int
) -> None:
    _, rec, log = recorded
    start = {**log.start_message(), "rebuild": log.rebuild(at).to_json()}
    with TritonStreamSession(triton.grpc_url, model) as s:
        s.send(start, start=True)
        t = Transcript()
        while True:
            reply = s.next(30)
            t.add(reply.message, reply.data)
            if reply.message and reply.message.get("type") == "video.chunk_metadata":
                break
        s.stop()
        for reply in s.until("session.done", 60):
            t.add(reply.message, reply.data)
    first, payload = t.pairs[0]
    assert first["generation_chunk_index"] == at and first["transport_chunk_index"] == 0
    history = {e.event_id for e in log.events}
    named = set(first["started_event_ids"]) | set(first["active_event_ids"]) | set(first["transition_progress"])
    assert not named & history, "rebuilt events are history: the new stream never names them"
    done = t.messages[-1]
    assert done["type"] == "session.done" and not (set(done["unfinished_event_ids"]) & history)
    # the generator's frames of chunk N are the recorded session's (test_replay_is_the_recorded_session:
    # the replay re-makes the recorded MP4 byte for byte); the new stream's encoder starts at chunk N
    raw = next(c.frames for c in replay_frames(log, generator) if c.plan.generation_chunk_index == at)
    config = session_config(log)
    fresh = FragmentedMp4Encoder(config.width, config.height, config.fps, catalog.LIMITS["builtin"])
    assert payload == fresh.encode_chunk(raw), "chunk N is the recorded chunk N's frames, encoded afresh"
    rebuilt = decode(payload)  # the new stream's first payload carries its init segment
    recorded_frames = split_chunks(decode(bytes(rec.video)), [m["num_frames"] for m in rec.transcript.media])
    assert rebuilt.shape == recorded_frames[at].shape
    # x264's rate control carries history across chunks, so the recorded chunk N (its encoder's
    # N+1th) and the rebuilt one (a fresh encoder's first) are two encodings of the same frames:
    # they differ from each other by about what each loses to the codec (~40 dB at this size)
    loss = min(psnr(a, b) for a, b in zip(recorded_frames[at], raw, strict=True))
    assert min(psnr(a, b) for a, b in zip(rebuilt, raw, strict=True)) >= loss - 3
    assert min(psnr(a, b) for a, b in zip(rebuilt, recorded_frames[at], strict=True)) >= 35


def test_a_bad_rebuild_is_an_invalid_start(triton: Any) -> None:
    bad = {
        "generation_chunk_index": 2,
        "events": [{"chunk": 1, "frame_offset": 9, "interaction": {"event_id": "c", "event": CAMERA}}],
    }
    with TritonStreamSession(triton.grpc_url, FAST_MODEL) as s:
        s.send({"type": "session.start", "prompt": "x", "rebuild": bad}, start=True)
        first = s.next()
        s.send({"type": "session.stop"}, end=True)
    assert first.message["code"] == "invalid_start" and "frame_offset 9" in first.message["message"]
