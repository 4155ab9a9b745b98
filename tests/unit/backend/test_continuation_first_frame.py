"""A LingBot-World continuation (a branch or a move, from the viewer's last frame) does not show
that frame twice: the pipeline pins its first output frame to its first frame
(`_prepare_condition`'s temporal mask, read in the wheel below), so the source asks the engine
for one frame more and drops the first."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from rtvideo.backend.runtime.sources import SourceChunk
from rtvideo.backend.vllm_omni.engine import EngineRequest
from rtvideo.backend.vllm_omni.model_rules import HELIOS_DISTILLED, LINGBOT_WORLD
from rtvideo.backend.vllm_omni.output_queue import OutputQueue
from rtvideo.backend.vllm_omni.source import EngineSources
from rtvideo.core.rebuild import Rebuild
from rtvideo.core.session_config import SessionConfig
from tests.support.omni_standin import StandInOutput
from tests.support.vllm_omni_wheel import wheel_source


class _Host:
    """Records what the engine is asked for; the test hands the engine's outputs to the request's
    sink, as `EngineHost` does."""

    dead = None

    def start_request(self, wanted: EngineRequest) -> None:
        self.frames = wanted.num_frames  # what the engine is asked for
        self.sink: OutputQueue = wanted.sink

    def output(self, video: np.ndarray) -> None:
        self.sink.offer(StandInOutput("r1", {}, images=[video]), 0.0, video.nbytes)

    def end_request(self, request_id: str) -> None:
        pass


class _Encoder:
    def encode_chunk(self, frames: np.ndarray) -> bytes:
        self.first = frames[0].copy()
        return bytes(len(frames))

    def close(self) -> bytes:
        return b""


CONFIG = SessionConfig(
    prompt="a harbour", format="m4s", model="m", width=832, height=480, fps=16, frames_per_chunk=12,
    default_transition_chunks=2, num_frames=45, seed=1,
)  # fmt: skip
LAST_FRAME = np.full((480, 832, 3), 200, np.uint8)


def _sources(rules: Any) -> tuple[EngineSources, _Host, _Encoder]:
    host, encoder = _Host(), _Encoder()
    return EngineSources(host, {}, 3600.0, lambda w, h, f: encoder, rules=rules), host, encoder  # type: ignore[arg-type]


def test_a_lingbot_continuation_drops_the_repeated_frame_and_asks_for_one_more() -> None:
    sources, host, encoder = _sources(LINGBOT_WORLD)
    continued = replace(CONFIG, rebuild=Rebuild(3, frames_before=21), reference_image=LAST_FRAME)
    source = sources.open(continued, "r1")
    assert host.frames == 57 and sources.engine_frames(CONFIG) == 45  # one more, still n % 12 == 9
    video = np.zeros((1, 9, 480, 832, 3), np.float32)
    video[0, 0] = 200 / 255  # the engine's frame 0: the viewer's last frame again
    host.output(video)
    chunk = source.next_chunk(9)
    assert isinstance(chunk, SourceChunk)
    assert chunk.media.frames == 8 and int(encoder.first.max()) == 0  # frame 0 was not encoded
    host.output(video)
    second = source.next_chunk(9)
    assert isinstance(second, SourceChunk) and second.media.frames == 9  # only the request's first frame repeats


def test_a_fresh_start_and_helios_keep_every_frame() -> None:
    for rules, config in ((LINGBOT_WORLD, replace(CONFIG, reference_image=LAST_FRAME)), (HELIOS_DISTILLED, CONFIG)):
        sources, _, _ = _sources(rules)
        assert not sources.repeats_last_frame(config)


def test_lingbots_first_output_frame_is_its_first_frame_in_the_wheel() -> None:
    source = wheel_source("vllm_omni/diffusion/models/lingbot_world/pipeline.py")
    assert "video_condition[:, :, 0] = image" in source and "temporal_mask[:, :, 0] = 1" in source
