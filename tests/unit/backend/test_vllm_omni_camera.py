"""Camera events on the `vllm_omni` path: forwarded unchanged when the engine's pipeline
registers `camera` (vLLM-Omni's registry: LingBot-World), refused by the model's admission as
`interaction_failed` naming the modality otherwise (Helios), and the engine's own camera lists
reported.

The engine is the stand-in (tests/support/omni_standin.py) hosted by the real `EngineHost`: its
interaction path is the wheel's `InteractionCoordinator` with the wheel's
`SE3DeltaCameraHandler`, so what it reports is what vLLM-Omni would.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rtvideo.backend.loading.settings import BackendSettings
from rtvideo.backend.runtime.manager import SessionManager
from rtvideo.backend.runtime.session import Limits
from rtvideo.backend.runtime.sources import Interaction, SourceChunk
from rtvideo.backend.vllm_omni.engine import EngineError, EngineHost
from rtvideo.backend.vllm_omni.model_rules import HELIOS_DISTILLED
from rtvideo.backend.vllm_omni.source import EngineChunkSource, EngineSources
from rtvideo.core.interaction.parse import parse_interaction
from rtvideo.core.interaction.refusal import interaction_refusal
from rtvideo.core.interaction.types import InteractionRequest
from rtvideo.core.protocol import parse_message
from rtvideo.core.session_config import resolve_session_config
from rtvideo.core.start_request import check_first_message, validate_start
from tests.support.omni_standin import StandInAsyncOmni, StandInSamplingParams
from tests.support.recorder import Recorder
from tests.support.runtime_standins import SECRET

VELOCITY = {"mode": "velocity", "data": {"translation": [0.0, 0.0, 0.05], "rotation": [0.0, 0.0, 0.0, 1.0]}}
TARGET = {"mode": "target", "data": {"translation": [1.0, 0.0, 0.0], "rotation": [0.0, 0.0, 0.0, 1.0]}}


class NullEncoder:
    def encode_chunk(self, frames: np.ndarray) -> bytes:
        return b"x"

    def close(self) -> bytes:
        return b""


#: a 1x1 PNG: a start's image_reference (the source gets the decoded image from the test)
PIXEL = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC"
)


def host_and_source(
    pipeline: str, record: Path, start: dict[str, Any] | None = None, image: np.ndarray | None = None
) -> tuple[EngineHost, Any]:
    host = EngineHost(
        StandInAsyncOmni,
        model="m",
        engine_args={
            "record": str(record),
            "chunk_seconds": 0.05,
            "first_chunk_seconds": 0.05,
            "frames_per_chunk": 4,
            "model_class_name": pipeline,
        },
        health_seconds=60,
    )
    # LingBot-World's rules (model_rules.py): 832x480 only, a first frame, n % 12 == 9 frames
    lingbot = pipeline == "LingBotWorldCausalDMDPipeline"
    width, height, frames = ("832", "480", 45) if lingbot else ("128", "128", 40)
    settings = BackendSettings.from_parameters(
        {
            "generator": "vllm_omni",
            "width": width,
            "height": height,
            "frames_per_chunk": "4",
            "vllm_omni_engine_args": json.dumps({"model_class_name": pipeline}),
        }
    )
    first_frame = {"image_reference": {"image_url": PIXEL}} if lingbot else {}
    fields = {"prompt": "p", "num_frames": frames, **first_frame, **(start or {})}
    config = resolve_session_config(
        validate_start(check_first_message(json.dumps({"type": "session.start", **fields}))),
        settings.capabilities("realtime_video"),
    )
    if image is None and lingbot:
        image = np.zeros((480, 832, 3), np.uint8)
    if image is not None:  # as the manager sets it from the start's image_reference
        config = replace(config, reference_image=image)
    rules = settings.model_rules()
    assert rules is not None
    source = EngineChunkSource(host, config, "r", frames, {}, NullEncoder, rules.first_frame_at)
    return host, source


def admission(event_id: str, event: dict[str, Any], n: int | None = None) -> Interaction:
    interaction: dict[str, Any] = {"event_id": event_id, "event": event}
    if n is not None:
        interaction["transition_chunks"] = n
    request = parse_message(json.dumps({"type": "session.interaction", "interaction": interaction}))
    assert isinstance(request, InteractionRequest)
    return Interaction.admitted(request, event_id, prompt_default=3, received_at=time.monotonic())


def records(path: Path, call: str) -> list[dict[str, Any]]:
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["call"] == call]


def test_a_camera_pipeline_gets_the_camera_event_unchanged_and_its_lists_are_reported(tmp_path: Path) -> None:
    record = tmp_path / "calls.jsonl"
    host, source = host_and_source("LingBotWorldCausalDMDPipeline", record)
    try:
        first = source.next_chunk(4)
        assert isinstance(first, SourceChunk)
        source.admit_event(admission("fwd", {"multi_modal_data": {"camera": VELOCITY}}))
        plans = []
        for _ in range(4):
            item = source.next_chunk(4)
            assert isinstance(item, SourceChunk), item
            plans.append(item.plan)
        source.admit_event(admission("aim", {"multi_modal_data": {"camera": TARGET}}, n=0))
        for _ in range(4):
            item = source.next_chunk(4)
            assert isinstance(item, SourceChunk), item
            plans.append(item.plan)
    finally:
        source.close()
        host.shutdown()
    submits = records(record, "submit")
    assert [s["multi_modal_data"] for s in submits] == [{"camera": VELOCITY}, {"camera": TARGET}]
    assert [s["transition_chunks"] for s in submits] == [None, 0]  # as sent: the engine's default applies
    started = [e for p in plans for e in p.started]
    assert started == ["fwd", "aim"]
    held = [p for p in plans if "fwd" in p.active]
    assert held and all(p.progress["fwd"] == 1.0 for p in held)
    # the target replaced the held velocity: both completed on the chunk it started
    (replaced,) = [p for p in plans if "aim" in p.started]
    assert set(replaced.completed) == {"fwd", "aim"}
    for plan in plans:
        assert set(plan.progress) == set(plan.active)


def test_a_prompt_only_pipeline_refuses_a_camera_event_by_name(tmp_path: Path) -> None:
    """Through the model's session manager, as the Triton model drives it: the camera event is
    acked, then `interaction_failed` with what `interaction_refusal` says of it (the model rule
    table's modalities for Helios), and it never reaches the engine."""
    record = tmp_path / "calls.jsonl"
    host = EngineHost(
        StandInAsyncOmni,
        model="m",
        engine_args={"record": str(record), "chunk_seconds": 0.05, "frames_per_chunk": 4},
        health_seconds=60,
    )
    settings = BackendSettings.from_parameters(
        {
            "generator": "vllm_omni",
            "width": "128",
            "height": "128",
            "frames_per_chunk": "4",
            "vllm_omni_engine_args": json.dumps({"model_class_name": "HeliosPyramidPipeline"}),
        }
    )
    manager = SessionManager(
        sources=EngineSources(host, {}, 60.0, lambda w, h, fps: NullEncoder()),
        capabilities=settings.capabilities("realtime_video"),
        limits=Limits(pacing_lead_chunks=None, max_session_seconds=60.0, stall_timeout_seconds=60.0),
        max_sessions=1,
    )
    stream, ack = Recorder(), Recorder()
    message = {
        "type": "session.interaction",
        "interaction": {"event_id": "fwd", "event": {"multi_modal_data": {"camera": VELOCITY}}},
    }
    try:
        start = b'{"type": "session.start", "prompt": "p", "num_frames": 40}'
        manager.on_request(1, start, start=True, end=False, channel=stream, secret=SECRET)
        manager.on_request(1, json.dumps(message).encode(), start=False, end=False, channel=ack, secret=SECRET)
        stop = b'{"type": "session.stop"}'
        manager.on_request(1, stop, start=False, end=True, channel=Recorder(), secret=SECRET)
        assert stream.finished.wait(10)
    finally:
        manager.shutdown()
    assert ack.types() == ["session.interaction.queued"]
    (error,) = [m for m, _, _ in stream.sent if m and m["type"] == "error"]
    refusal = interaction_refusal(parse_interaction(message), settings.interactions(), settings.pipeline_interactions())
    assert refusal is not None
    assert (error["code"], error["message"], error["event_id"]) == (refusal.code.value, refusal.message, "fwd")
    assert "'camera' is not supported by pipeline 'HeliosPyramidPipeline'" in error["message"]
    assert records(record, "submit") == []


def first_generate(
    tmp_path: Path, pipeline: str, start: dict[str, Any] | None = None, image: np.ndarray | None = None
) -> dict[str, Any]:
    """A session's first chunk; the engine request it made, as the stand-in recorded it."""
    record = tmp_path / "calls.jsonl"
    host, source = host_and_source(pipeline, record, start, image)
    try:
        assert isinstance(source.next_chunk(4), SourceChunk)
    finally:
        source.close()
        host.shutdown()
    (generate,) = records(record, "generate")
    return generate


def test_lora_reaches_the_engine_request(tmp_path: Path) -> None:
    lora = {"name": "style", "path": "/loras/style", "scale": 0.5}
    generate = first_generate(tmp_path, "HeliosPyramidPipeline", {"lora": lora})
    assert generate["lora_request"] == lora


def test_the_reference_image_goes_to_the_engine_as_multi_modal_data_image(tmp_path: Path) -> None:
    image = np.zeros((48, 64, 3), np.uint8)
    generate = first_generate(tmp_path, "LingBotWorldCausalDMDPipeline", image=image)
    assert generate["image_shape"] == [48, 64, 3] and generate["prompt"] == {"prompt": "p"}


def test_helios_takes_the_reference_image_where_its_step_mode_reads_it(tmp_path: Path) -> None:
    """`extra_args["image"]`, straight into its VAE: a float tensor [1, 3, H, W] in [-1, 1]."""
    image = np.zeros((128, 128, 3), np.uint8)
    image[:, 64:] = 255
    generate = first_generate(tmp_path, "HeliosPyramidPipeline", image=image)
    assert generate["image_shape"] is None  # not in the prompt, where Helios would never read it
    assert generate["extra_args_image"] == {
        "shape": [1, 3, 128, 128],
        "dtype": "float32",
        "min": -1.0,
        "max": 1.0,
        "mean": [0.0, 0.0, 0.0],  # half black, half white
    }


def test_the_standin_refuses_what_the_pipelines_refuse() -> None:
    lingbot = StandInAsyncOmni(model="m", model_class_name="LingBotWorldCausalDMDPipeline")
    helios = StandInAsyncOmni(model="m", model_class_name="HeliosPyramidPipeline")
    image = np.zeros((480, 832, 3), np.uint8)
    stage2 = HELIOS_DISTILLED.preset["extra_params"]

    def params(**fields: Any) -> StandInSamplingParams:
        return StandInSamplingParams(
            **{"width": 832, "height": 480, "num_frames": 45, "num_inference_steps": 4, **fields}
        )

    assert lingbot._pipeline_refusal(image, params()) is None
    assert lingbot._pipeline_refusal(image, params(num_inference_steps=None)) is None  # the pipeline's 4
    assert "832×480 only" in (lingbot._pipeline_refusal(image, params(width=640, height=384)) or "")
    assert "num_frames 40" in (lingbot._pipeline_refusal(image, params(num_frames=40)) or "")
    assert "exactly 4 inference steps" in (lingbot._pipeline_refusal(image, params(num_inference_steps=8)) or "")
    assert "image_reference is required" in (lingbot._pipeline_refusal(None, params()) or "")
    # Helios' grid is the request's pyramid's: 64 with the distilled preset's stage 2, 16 without
    assert "multiple of 64" in (helios._pipeline_refusal(None, params(extra_args=dict(stage2))) or "")
    assert helios._pipeline_refusal(None, params()) is None
    two_steps = {**stage2, "pyramid_num_inference_steps_list": [1, 1]}
    assert "one step count per stage (3)" in (helios._pipeline_refusal(None, params(extra_args=two_steps)) or "")
    assert (
        helios._pipeline_refusal(
            None, params(width=640, height=384, num_frames=40, num_inference_steps=None, extra_args=dict(stage2))
        )
        is None
    )
    flat = {**stage2, "image": np.zeros((384, 640, 3), np.float32)}  # not the [1, 3, H, W] its VAE takes
    assert "[1, 3, 384, 640]" in (helios._pipeline_refusal(None, params(width=640, height=384, extra_args=flat)) or "")


def test_an_interaction_after_the_request_ended_never_reaches_the_engine(tmp_path: Path) -> None:
    """The ordering lock lives from the request's start to its end: an interaction racing the end
    fails here, instead of making a lock of its own (left behind for good) and reaching an
    engine that has no such request."""
    record = tmp_path / "calls.jsonl"
    host, source = host_and_source("HeliosPyramidPipeline", record)
    try:
        assert isinstance(source.next_chunk(4), SourceChunk)
        host.end_request("r")
        late = host.interact("r", {"event_id": "late", "event": {"prompt": "x"}, "transition_chunks": 1})
        with pytest.raises(EngineError, match="not running"):
            late.result(10)
    finally:
        source.close()
        host.shutdown()
    assert records(record, "submit") == []
