"""A vllm_omni session branched from its recording, and moved to another Triton: the engine's
state cannot be rebuilt, so each goes on from the last frame the viewer saw as the engine's
first frame, with the prompt in effect (rtvideo.core.approximation), its generation chunk
indices continuing. Real tritonserver with the stand-in engine (the `omni` fixture), real proxy
and WebSocket clients; what reached the engine is read from its record."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from tests.support.http_calls import drain, finished, http_base
from tests.support.omni_standin import colour
from tests.support.omni_triton import FPC, MODEL, Engine
from tests.support.proxy_client import Ws, ws
from tests.support.proxy_host import run
from tests.support.streams import Transcript, check_stream_rules, decode

CHUNKS = 14


def first_frame_colour(call: dict[str, Any]) -> np.ndarray:
    """The mean colour (0-1) of the first frame the engine got in `extra_args["image"]` ([-1, 1])."""
    summary = call["extra_args_image"]
    assert summary is not None and summary["shape"][:2] == [1, 3], call
    return (np.array(summary["mean"]) + 1) / 2


def generates(engine: Engine, seed: int) -> list[dict[str, Any]]:
    return engine.calls("generate", seed=seed)


def test_a_branch_starts_from_the_recorded_frame_with_the_prompt_in_effect(omni, tmp_path) -> None:
    proxies, engines = omni
    engine = engines[MODEL]
    url = proxies.url(model=MODEL, recordings=str(tmp_path / "rec"))

    async def record() -> Transcript:
        async with ws(url) as conn:
            s = Ws(conn)
            await s.start("a harbour", seed=501, num_frames=CHUNKS * FPC, record=True)
            await s.next_media()
            await s.interact("late snow", "late", 1)
            return await s.finish()

    recorded = run(record())
    rid, key = recorded.messages[0]["recording_id"], recorded.messages[0]["recording_token"]
    assert finished(http_base(url), rid, key)["status"] == "complete"
    late = next(m["generation_chunk_index"] for m in recorded.media if "late" in m["started_event_ids"])
    assert late + 2 < CHUNKS, recorded.media

    async def branch(n: int) -> Transcript:
        async with ws(url) as conn:
            s = Ws(conn)
            spec = {"recording_id": rid, "generation_chunk_index": n, "recording_token": key}
            await s.send({"type": "session.start", "from_recording": spec})
            return await s.finish()

    for n in (0, late + 2):
        t = run(branch(n))
        if n == 0:
            check_stream_rules(t)  # it numbers generation chunks from 0: a branch's go on from N
        start = t.messages[0]
        assert start["branched_from"] == {"recording_id": rid, "generation_chunk_index": n}
        assert start["branch_exact"] is False and start["config"]["seed"] == 501
        assert [m["generation_chunk_index"] for m in t.media] == list(range(n, CHUNKS))
        assert [m["transport_chunk_index"] for m in t.media] == list(range(CHUNKS - n))
        assert decode(t.video).shape[0] == (CHUNKS - n) * FPC  # the frames the recording had left
        call = generates(engine, 501)[-1]
        if n == 0:  # the recorded start again: its prompt, no first frame
            assert call["prompt"]["prompt"] == "a harbour" and call["extra_args_image"] is None
        else:  # the prompt in effect, and the recording's frame before chunk N as the first frame
            assert call["prompt"]["prompt"] == "late snow"
            assert np.abs(first_frame_colour(call) - colour("late snow").numpy()).max() < 0.03, call


def test_a_drained_session_goes_on_from_its_last_frame(omni) -> None:
    """The session's endpoint drained, then taken back: the waiting move lands on it again, as
    a move after a restart does (a second Triton would be the same to the session)."""
    proxies, engines = omni
    engine = engines[MODEL]
    server = proxies.server(model=MODEL, move_patience_seconds=30.0, admin_token="approximations-operator")

    async def body() -> tuple[Transcript, dict[str, Any]]:
        async with ws(server.url) as conn:
            s = Ws(conn)
            await s.start("a harbour", seed=502, num_frames=CHUNKS * FPC)
            await s.next_media()
            await s.interact("late snow", "late", 3)
            await s.until(lambda m: m["type"] == "video.chunk_metadata" and "late" in m["started_event_ids"])
            status, drained = await asyncio.to_thread(drain, server, proxies.triton_url)
            assert status == 200, drained
            assert (await asyncio.to_thread(drain, server, proxies.triton_url, "DELETE"))[0] == 200
            return await s.finish(), drained

    t, drained = run(body())
    assert drained["sessions"] == drained["moving"] == 1, drained
    check_stream_rules(t)  # one video.start, the lifetimes; no error
    assert [m["generation_chunk_index"] for m in t.media] == list(range(CHUNKS))
    assert [m["transport_chunk_index"] for m in t.media] == list(range(CHUNKS))
    assert decode(t.video).shape[0] == CHUNKS * FPC  # one stream, every frame
    ended = [m for m in t.media if "late" in m["completed_event_ids"]]
    assert len(ended) == 1 and t.messages[-1]["unfinished_event_ids"] == []
    first, moved = generates(engine, 502)
    assert first["extra_args_image"] is None and moved["prompt"]["prompt"] == "late snow"
    assert moved["num_frames"] < first["num_frames"]  # what the session had left
    # the engine's first frame is the last frame the viewer had before the move
    before = first["num_frames"] - moved["num_frames"]
    assert before % FPC == 0 and 0 < before < CHUNKS * FPC, (first, moved)
    seen = decode(t.video)[before - 1].reshape(-1, 3).mean(axis=0) / 255
    assert np.abs(first_frame_colour(moved) - seen).max() < 0.03, (moved, seen)
