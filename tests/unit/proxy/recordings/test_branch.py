"""What the proxy sends the model for a branch (rtvideo.proxy.recordings.branch), from a recording
written straight into a local store: a vllm_omni recording's approximation (its last frame before
N, decoded from video.mp4, the prompt in effect, the frames left, chunks numbered from N) and a
recording deleted, or damaged, while a branch reads it (invalid_start, nothing half-read); a
branch without the recording's token (as if the recording did not exist); the log read off the
event loop, and the bound on branches prepared at once."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rtvideo.backend.media.encoder import FragmentedMp4Encoder
from rtvideo.backend.media.image_reference import MediaPolicy, load_image_reference
from rtvideo.core.errors import ProtocolError
from rtvideo.proxy.observability.metrics import ProxyMetrics
from rtvideo.proxy.recordings import branch as branch_module
from rtvideo.proxy.recordings import ids
from rtvideo.proxy.recordings.backing import EVENTS, MANIFEST, VIDEO, LocalBacking
from rtvideo.proxy.recordings.branch import Branch, branch_start
from rtvideo.proxy.recordings.service import MAX_BRANCHES, Recordings
from rtvideo.proxy.recordings.store import TOKEN_DIGEST, Limits, RecordingStore, token_digest

W, H, FRAMES, CHUNKS = 64, 48, 3, 4
TOKEN = "rk1.the-recordings-token"
ENGINE_CONFIG = {"seed": 11, "fps": 16, "width": W, "height": H, "sampling": {"guidance_scale": 1.0}}


def chunk(k: int) -> np.ndarray:
    return np.full((FRAMES, H, W, 3), 30 + 50 * k, np.uint8)


def line(direction: str, message: dict[str, Any]) -> str:
    return json.dumps({"t": 0.0, "dir": direction, "message": message})


def write_recording(root: Path, config: dict[str, Any]) -> str:
    """A finished recording of CHUNKS chunks: p1 ("snow") started in chunk 1."""
    rid = ids.new_id()
    folder = root / rid
    folder.mkdir(parents=True)
    encoder = FragmentedMp4Encoder(W, H, 16)
    (folder / VIDEO).write_bytes(b"".join(encoder.encode_chunk(chunk(k)) for k in range(CHUNKS)) + encoder.close())
    lines = [
        line("in", {"type": "session.start", "prompt": "a harbour", "num_frames": CHUNKS * FRAMES}),
        line("out", {"type": "video.start", "request_id": "r", "config": config}),
        line("in", {"type": "session.interaction", "interaction": {"event_id": "p1", "event": {"prompt": "snow"}}}),
        line("out", {"type": "session.interaction.queued", "request_id": "r", "event_id": "p1"}),
    ]
    for k in range(CHUNKS):
        meta = {"type": "video.chunk_metadata", "kind": "media", "generation_chunk_index": k, "num_frames": FRAMES}
        lines.append(line("out", {**meta, "started_event_ids": ["p1"] if k == 1 else []}))
    (folder / EVENTS).write_text("\n".join(lines) + "\n")
    (folder / MANIFEST).write_text(json.dumps({"id": rid, "status": "complete", TOKEN_DIGEST: token_digest(TOKEN)}))
    return rid


@pytest.fixture
def recordings(tmp_path: Path) -> Recordings:
    store = RecordingStore(LocalBacking(tmp_path), Limits(max_bytes=10**9, max_age=None))
    return Recordings(store, record_all=False, metrics=ProxyMetrics(recordings=True))


def branch(recordings: Recordings, rid: str, n: int, token: str = TOKEN, **given: Any) -> tuple[dict[str, Any], Branch]:
    raw, out = asyncio.run(branch_start(recordings, Branch(rid, n, token), given))
    return json.loads(raw), out


@pytest.mark.parametrize("token", ["rk1.another-recordings-token", ""])
def test_without_its_token_a_recording_is_as_unknown(recordings: Recordings, tmp_path: Path, token: str) -> None:
    rid = write_recording(tmp_path, ENGINE_CONFIG)
    with pytest.raises(ProtocolError) as refused:
        branch(recordings, rid, 1, token=token)
    assert (
        refused.value.code.value == "invalid_start" and refused.value.message == f"from_recording: no recording {rid}"
    )


def test_a_differing_field_is_named_never_quoted(recordings: Recordings, tmp_path: Path) -> None:
    rid = write_recording(tmp_path, ENGINE_CONFIG)
    with pytest.raises(ProtocolError) as refused:
        branch(recordings, rid, 1, prompt="something else")
    assert refused.value.message.startswith("prompt: a branch keeps the recording's value")
    assert "harbour" not in refused.value.message and "something else" not in refused.value.message


def test_the_log_is_read_off_the_event_loop_and_branches_are_bounded(
    recordings: Recordings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rid = write_recording(tmp_path, ENGINE_CONFIG)
    readers: list[str] = []
    release = threading.Event()
    read_log = branch_module.read_log

    def slow_read_log(lines: Any) -> Any:
        readers.append(threading.current_thread().name)
        release.wait(30)
        return read_log(lines)

    monkeypatch.setattr(branch_module, "read_log", slow_read_log)

    async def many() -> list[Any]:
        tasks = [
            asyncio.ensure_future(branch_start(recordings, Branch(rid, 2, TOKEN), {})) for _ in range(MAX_BRANCHES + 3)
        ]
        await asyncio.sleep(0.2)  # the loop is free while the logs are read: this sleep ends on time
        release.set()
        return await asyncio.gather(*tasks, return_exceptions=True)

    results = asyncio.run(many())
    busy = [r for r in results if isinstance(r, ProtocolError)]
    assert len(busy) == 3 and all(r.code.value == "server_busy" for r in busy)
    assert sum(isinstance(r, tuple) for r in results) == MAX_BRANCHES
    assert readers and all(name.startswith("rtvideo-branches") for name in readers)


def test_a_vllm_omni_branch_starts_from_the_frame_before_n_with_the_prompt_in_effect(
    recordings: Recordings, tmp_path: Path
) -> None:
    rid = write_recording(tmp_path, ENGINE_CONFIG)
    start, out = branch(recordings, rid, 3)
    assert out.exact is False and out.generation_chunk_index == 3
    assert (start["prompt"], start["seed"], start["num_frames"]) == ("snow", 11, CHUNKS * FRAMES)
    # nothing replayed: numbered from N; the model takes the frames shown off the length (FRAMES left)
    assert start["rebuild"] == {"generation_chunk_index": 3, "events": [], "frames_before": 3 * FRAMES}
    frame = np.asarray(load_image_reference(start["image_reference"], MediaPolicy()))
    assert frame.shape == (H, W, 3) and abs(float(frame.mean()) - (30 + 50 * 2)) < 3  # chunk 2's last frame
    start, _ = branch(recordings, rid, 1)
    assert start["prompt"] == "a harbour"  # p1 starts in chunk 1: not yet in effect before it
    start, _ = branch(recordings, rid, 0)
    assert "image_reference" not in start and start["num_frames"] == CHUNKS * FRAMES


def test_a_built_in_branch_is_exact(recordings: Recordings, tmp_path: Path) -> None:
    rid = write_recording(tmp_path, {k: v for k, v in ENGINE_CONFIG.items() if k != "sampling"})
    start, out = branch(recordings, rid, 3)
    assert out.exact is True and "image_reference" not in start and start["prompt"] == "a harbour"
    assert [e["interaction"]["event_id"] for e in start["rebuild"]["events"]] == ["p1"]


@pytest.mark.parametrize("gone_at", [EVENTS, VIDEO])
def test_a_recording_deleted_while_a_branch_reads_it_is_invalid_start(
    recordings: Recordings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gone_at: str
) -> None:
    rid = write_recording(tmp_path, ENGINE_CONFIG)
    opened = recordings.store.open

    def deleting_first(r: str, name: str) -> Any:
        if name == gone_at:
            assert recordings.store.delete(r)
        return opened(r, name)

    monkeypatch.setattr(recordings.store, "open", deleting_first)
    with pytest.raises(ProtocolError, match=f"no recording {rid}") as refused:
        branch(recordings, rid, 2)
    assert refused.value.code.value == "invalid_start"


def test_a_video_that_does_not_decode_is_invalid_start(recordings: Recordings, tmp_path: Path) -> None:
    rid = write_recording(tmp_path, ENGINE_CONFIG)
    (tmp_path / rid / VIDEO).write_bytes(b"\x00\x00\x00\x04ftypisom")  # a box shorter than its header
    with pytest.raises(ProtocolError, match="video: the stream is no fMP4"):
        branch(recordings, rid, 2)


def test_a_branch_runs_for_the_length_its_start_asks(recordings: Recordings, tmp_path: Path) -> None:
    """`num_frames` / `seconds` of a branch's start are what its stream carries from chunk N (the
    model counts from chunk 0, so the chunks before N are added); without them the recording's."""
    built_in = {k: v for k, v in ENGINE_CONFIG.items() if k != "sampling"}
    rid = write_recording(tmp_path, built_in)
    start, _ = branch(recordings, rid, 1, num_frames=2 * FRAMES)
    assert start["num_frames"] == FRAMES + 2 * FRAMES and "seconds" not in start
    start, _ = branch(recordings, rid, 2, seconds=0.375)  # 6 frames at the recording's 16 fps
    assert start["num_frames"] == 2 * FRAMES + 6
    start, _ = branch(recordings, rid, 2)
    assert start["num_frames"] == CHUNKS * FRAMES  # the recording's
    engine = write_recording(tmp_path, ENGINE_CONFIG)  # the approximation counts the same way
    start, _ = branch(recordings, engine, 3, num_frames=5)
    assert start["num_frames"] == 3 * FRAMES + 5 and start["rebuild"]["frames_before"] == 3 * FRAMES
    with pytest.raises(ProtocolError):
        branch(recordings, rid, 1, num_frames="many")
