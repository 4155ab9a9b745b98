"""Rebuilding a built-in session at chunk N equals generating it straight (raw frames, bit for bit),
before, during and after a prompt transition and a camera move with a mid-chunk frame offset;
the straight run admits its events live, placed by receipt time, as a session does.

`RTVIDEO_TEST_DEVICE=cuda` runs them on a GPU (scripts/gpu_check.sh does, with `--noconftest`):
replays and branches are exact only if rendering on that device is deterministic. Where the
bundled MiniLM is not installed (a bare GPU machine) prompts get the benchmark's fixed
pseudo-random embeddings: what is checked is rendering, not embedding."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from rtvideo.backend.builtin.generator import BuiltinGenerator
from rtvideo.backend.replay.regenerate import FrameRenderer, replay_frames
from rtvideo.backend.runtime.sources import GeneratorChunkSource
from rtvideo.core.chunks import media_metadata
from rtvideo.core.interaction.types import Interaction
from rtvideo.core.protocol import validate_interaction
from rtvideo.core.rebuild import Rebuild, parse_rebuild
from rtvideo.core.session_log import read_log
from tests.support.session_configs import session_config

FPS, FPC, CHUNKS = 16, 9, 11
CONFIG = session_config(
    prompt="a quiet harbour at dawn",
    format="m4s",
    model="realtime_video",
    height=48,
    fps=FPS,
    frames_per_chunk=FPC,
    seed=4242,
)
#: (chunk during which it is received, seconds after that chunk's boundary, interaction)
SCRIPT: list[tuple[int, float, dict[str, Any]]] = [
    (1, 0.1, {"event_id": "p1", "event": {"prompt": "a snowy street at night"}}),  # starts at 2, N=3: 2..4
    (
        4,
        4.5 / FPS,  # frame 4 of chunk 5
        {
            "event_id": "c1",
            "event": {"multi_modal_data": {"camera": {"mode": "target", "data": {"translation": [0.6, 0.1, 0.4]}}}},
            "transition_chunks": 2,
        },
    ),
    (5, 0.2, {"event_id": "p2", "event": {"prompt": "a red lighthouse at sunset"}, "transition_chunks": 1}),
    (
        7,
        7.2 / FPS,  # frame 7 of chunk 8: a velocity replaces the target
        {
            "event_id": "c2",
            "event": {
                "multi_modal_data": {
                    "camera": {
                        "mode": "velocity",
                        "data": {"translation": [0.0, 0.0, 0.02], "rotation": [0, 0.01, 0, 1]},
                    }
                }
            },
        },
    ),
]


@pytest.fixture(scope="module")
def generator() -> BuiltinGenerator:
    device = os.environ.get("RTVIDEO_TEST_DEVICE", "cpu")
    from benchmarks.bench_generator import HashedPromptEncoder, text_encoder_available
    from rtvideo.backend.builtin import generator as generator_module

    if text_encoder_available():
        return BuiltinGenerator(device=device, fps=FPS)
    with pytest.MonkeyPatch.context() as patch:  # a stand-in, patched in (a bare GPU machine)
        patch.setattr(generator_module, "PromptEncoder", HashedPromptEncoder)
        return BuiltinGenerator(device=device, fps=FPS)


def straight(generator: BuiltinGenerator) -> tuple[list[np.ndarray], list[dict[str, Any]]]:
    """Every chunk rendered, events admitted live between boundaries; returns frames and the
    event log a recording would hold."""
    now = [0.0]
    renderer = FrameRenderer(generator.open_session(width=64, height=48, seed=CONFIG.seed, fps=FPS))
    source = GeneratorChunkSource(renderer, CONFIG, clock=lambda: now[0])
    config_json = CONFIG.to_json()
    lines: list[dict[str, Any]] = [
        {"t": 0, "dir": "in", "message": {"type": "session.start", "prompt": CONFIG.prompt}},
        {"t": 0, "dir": "out", "message": {"type": "video.start", "request_id": "r", "config": config_json}},
    ]
    frames = []
    for index in range(CHUNKS):
        now[0] = float(index)  # this chunk's boundary
        chunk = source.next_chunk(FPC)
        assert renderer.last is not None
        frames.append(renderer.last)
        meta = media_metadata("r", index, chunk.plan, FPC, 0)
        lines.append({"t": index, "dir": "out", "message": meta})
        for during, after, body in SCRIPT:
            if during == index:
                message = {"type": "session.interaction", "interaction": body}
                request = validate_interaction(message)
                source.admit_event(
                    Interaction.admitted(
                        request,
                        body["event_id"],
                        prompt_default=3,
                        received_at=index + after,
                        interpolation_default="linear",
                    )
                )
                lines.append({"t": index, "dir": "in", "message": message})
                lines.append(
                    {
                        "t": index,
                        "dir": "out",
                        "message": {"type": "session.interaction.queued", "event_id": body["event_id"]},
                    }
                )
    source.close()
    return frames, json.loads(json.dumps(lines))  # as read back from events.jsonl


def test_the_log_records_where_each_event_took_effect(generator: BuiltinGenerator) -> None:
    _, lines = straight(generator)
    metas = [line["message"] for line in lines if line["message"]["type"] == "video.chunk_metadata"]
    assert metas[5]["started_event_ids"] == ["c1"] and metas[5]["event_frame_offsets"] == {"c1": 4}
    assert metas[8]["event_frame_offsets"] == {"c2": 7} and "c1" in metas[7]["completed_event_ids"]
    assert all("event_frame_offsets" not in m for i, m in enumerate(metas) if i not in (5, 8))
    log = read_log(lines)
    assert [(e.event_id, e.chunk, e.frame_offset) for e in log.events] == [
        ("p1", 2, 0),
        ("c1", 5, 4),
        ("p2", 6, 0),
        ("c2", 8, 7),
    ]


@pytest.mark.parametrize("at", [0, 1, 2, 3, 5, 6, 7, 8, 10])
def test_rebuild_at_n_equals_straight_generation(generator: BuiltinGenerator, at: int) -> None:
    frames, lines = straight(generator)
    log = read_log(lines)
    rebuilt = list(replay_frames(log, generator, rebuild_at=at))
    assert [c.plan.generation_chunk_index for c in rebuilt] == list(range(at, CHUNKS))
    for chunk in rebuilt:
        assert np.array_equal(chunk.frames, frames[chunk.plan.generation_chunk_index]), (
            chunk.plan.generation_chunk_index
        )
    # the scene moves: equality is not trivial
    assert not np.array_equal(frames[at], frames[min(at + 1, CHUNKS - 1)]) or at == CHUNKS - 1


def test_rebuilt_events_are_history_and_live_ones_after_them_win(generator: BuiltinGenerator) -> None:
    _, lines = straight(generator)
    log = read_log(lines)
    session = generator.open_session(width=64, height=48, seed=CONFIG.seed, fps=FPS)
    source = GeneratorChunkSource(FrameRenderer(session), replace(CONFIG, rebuild=log.rebuild(6)))
    # a live event before chunk 6's boundary comes after the history due there (p2): it supersedes it
    live = validate_interaction(
        {"type": "session.interaction", "interaction": {"event_id": "u", "event": {"prompt": "fog"}}}
    )
    source.admit_event(Interaction.admitted(live, "u", prompt_default=3, received_at=0.0))
    plan = source.next_chunk(FPC).plan
    assert plan.generation_chunk_index == 6
    assert plan.started == ("u",) and plan.active == ("u",) and plan.superseded == ()  # p2, c1: history
    assert set(plan.progress) == {"u"}
    assert plan.mix == {"a snowy street at night": 2 / 3, "fog": 1 / 3} or "fog" in plan.mix
    source.close()


@pytest.mark.parametrize("at", [3, 6, 7])
def test_named_events_keep_their_place_in_the_lists_of_the_new_stream(generator: BuiltinGenerator, at: int) -> None:
    """A moved session's own events (`named`): from chunk N on, the rebuilt stream's lists are
    the straight run's, an event in progress included (p1 at 3, c1 and p2 at 6 and 7)."""
    _, lines = straight(generator)
    metas = [line["message"] for line in lines if line["message"]["type"] == "video.chunk_metadata"]
    log = read_log(lines)
    own = Rebuild(at, tuple(replace(e, named=True) for e in log.rebuild(at).events))
    assert Rebuild(at, own.events).to_json() == parse_rebuild(own.to_json()).to_json()  # `named` round-trips
    assert own.history_ids == frozenset() and {e.event_id for e in own.named} == {e.event_id for e in own.events}
    session = generator.open_session(width=64, height=48, seed=CONFIG.seed, fps=FPS)
    source = GeneratorChunkSource(FrameRenderer(session), replace(CONFIG, rebuild=own))
    keys = ("started_event_ids", "active_event_ids", "completed_event_ids", "superseded_event_ids")
    for index in range(at, CHUNKS):
        if index > at and any(c == index - 1 for c, _, _ in SCRIPT):
            break  # a live event of the straight run is not in this rebuild: the lists part there
        meta = media_metadata("r", index, source.next_chunk(FPC).plan, FPC, 0)
        assert {k: meta[k] for k in keys} == {k: metas[index][k] for k in keys}, index
    source.close()


def test_a_rebuild_skips_the_reference_image(generator: BuiltinGenerator) -> None:
    image = np.zeros((48, 64, 3), np.uint8)
    straight_session = generator.open_session(width=64, height=48, seed=1, fps=FPS, image=image)
    straight_frames = [straight_session.generate({"p": 1.0}, FPC) for _ in range(3)]
    rebuilt = generator.open_session(width=64, height=48, seed=1, fps=FPS, image=image)
    renderer = FrameRenderer(rebuilt)
    source = GeneratorChunkSource(renderer, replace(CONFIG, prompt="p", rebuild=Rebuild(2)))
    source.next_chunk(FPC)
    assert renderer.last is not None and np.array_equal(renderer.last, straight_frames[2])


def test_a_generator_that_cannot_rebuild_refuses_a_rebuild_before_video_start() -> None:
    from tests.unit.backend.test_session_runtime import scripted, start

    mgr, _, _ = scripted()  # a source factory without `rebuilds`, as the vllm_omni generator's
    ch = start(mgr, rebuild={"generation_chunk_index": 2, "events": []})
    assert ch.finished.wait(5)
    assert ch.types() == ["error", "session.done"]
    assert ch.sent[0][0]["code"] == "invalid_start" and "rebuild is not supported" in ch.sent[0][0]["message"]
    mgr.shutdown()
