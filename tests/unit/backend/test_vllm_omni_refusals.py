"""Interactions vLLM-Omni 0.30 refuses, as it refuses them, and the stand-in
engine built from its own code.

`AsyncOmni.submit_interaction_async` raises for only a few things; the worker's refusals
(`InteractionCoordinator.enqueue_parts`, `PromptInteractionHandler.validate_payload`, both run
here from the pinned wheel) come back later as an error raised inside `generate()`, which aborts
the request. So the adapter refuses beforehand what those rules refuse (`interaction_failed`, the
session goes on), and an error that still comes through `generate()` ends the session naming the
events it may be about.
"""

from __future__ import annotations

import asyncio
import json
import queue
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from rtvideo.backend.runtime.sources import FailedEvent, Interaction
from rtvideo.backend.settings import BackendSettings
from rtvideo.backend.vllm_omni.engine import EngineError
from rtvideo.backend.vllm_omni.interaction_rules import INTERACTION_MODALITIES, pipeline_class, refusal
from rtvideo.backend.vllm_omni.source import EngineChunkSource
from rtvideo.core.session_config import resolve_session_config
from rtvideo.core.start_request import parse_start
from tests.support.omni_standin import StandInAsyncOmni, StandInSamplingParams
from tests.support.vllm_omni_wheel import Sampling, StepRequestState, load_interaction, wheel_source


def test_the_modality_table_is_the_wheels_registry() -> None:
    registry = load_interaction()["registry"].STRUCTURED_HANDLER_REGISTRY
    assert {k: frozenset(v) for k, v in registry.items()} == INTERACTION_MODALITIES


class _Pipeline:
    """Just enough pipeline for `InteractionCoordinator.build` and the prompt handler."""

    device = "cpu"
    transformer = SimpleNamespace(dtype=torch.float32)

    def encode_prompt(self, prompt: str, **_: Any) -> tuple[torch.Tensor, None]:
        return torch.zeros(3), None

    def peek_chunk_media(self, state: Any) -> Any:
        return None

    def apply_interaction_at_chunk_boundary(self, state: Any) -> None:
        pass

    def prepare_next_chunk(self, state: Any) -> None:
        pass


@pytest.mark.parametrize("pipeline", ["HeliosPyramidPipeline", "HeliosPipeline", "WanPipeline"])
@pytest.mark.parametrize(
    "event,transition_chunks",
    [
        ({"prompt": "a harbour"}, 2),
        ({"prompt": "a harbour"}, 0),
        ({"prompt": "a harbour"}, None),
        ({"prompt": ""}, 1),
        ({"prompt": "a harbour"}, -1),
    ],
)
def test_refusal_agrees_with_the_wheels_worker(pipeline: str, event: dict[str, Any], transition_chunks: Any) -> None:
    """What `refusal` says is what the engine refuses of a started request: `AsyncOmni`'s own
    checks first (their messages read from the wheel), then the wheel's coordinator and handler."""
    sync = wheel_source("vllm_omni/entrypoints/async_omni.py")
    assert 'raise ValueError("prompt must be non-empty")' in sync
    assert 'raise ValueError("transition_chunks must be >= 0")' in sync
    if not event["prompt"]:
        assert refusal(event, transition_chunks, pipeline) == "prompt must be non-empty"
        return
    if transition_chunks is not None and transition_chunks < 0:
        assert refusal(event, transition_chunks, pipeline) == "transition_chunks must be >= 0"
        return
    coordinator = load_interaction()["coordinator"].InteractionCoordinator.build(
        _Pipeline(), SimpleNamespace(model_class_name=pipeline)
    )
    state = StepRequestState("r", Sampling(), prompt_embeds=torch.zeros(3))
    parts = [("prompt", {"prompt": event["prompt"]})]
    try:
        coordinator.enqueue_parts(
            state, parts=parts, event_id="e", received_at=0.0, transition_chunks=transition_chunks
        )
        engine_says = None
    except ValueError as exc:
        engine_says = str(exc)
    assert refusal(event, transition_chunks, pipeline) == engine_says
    assert refusal(event, transition_chunks, None) is None  # an unknown pipeline: the engine decides


def test_the_pipeline_class_comes_from_engine_args_or_model_index(tmp_path: Path) -> None:
    assert pipeline_class("x", {"model_class_name": "HeliosPipeline"}) == "HeliosPipeline"
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "HeliosPyramidPipeline"}))
    assert pipeline_class(str(tmp_path), {}) == "HeliosPyramidPipeline"
    assert pipeline_class(str(tmp_path / "absent"), {}) is None


class FakeHost:
    def __init__(self) -> None:
        self.interactions: list[dict[str, Any]] = []
        self.sink: queue.Queue[tuple] | None = None

    def start_request(
        self, request_id: str, prompt: Any, config: Any, n: int, preset: Any, sink: Any, image_at: Any = None
    ) -> None:
        self.sink = sink

    def interact(self, request_id: str, interaction: dict[str, Any]) -> Any:
        import concurrent.futures

        self.interactions.append(interaction)
        future: concurrent.futures.Future[None] = concurrent.futures.Future()
        future.set_result(None)
        return future

    def end_request(self, request_id: str) -> None:
        pass


class FakeEncoder:
    def encode_chunk(self, frames: np.ndarray) -> bytes:
        return b""

    def close(self) -> bytes:
        return b""


def _source(pipeline: str | None) -> tuple[EngineChunkSource, FakeHost]:
    settings = BackendSettings.from_parameters(
        {"generator": "vllm_omni", "width": "128", "height": "128", "frames_per_chunk": "4"}
    )
    config = resolve_session_config(
        parse_start(json.dumps({"type": "session.start", "prompt": "p"}).encode()),
        settings.capabilities("realtime_video"),
    )
    host = FakeHost()
    source = EngineChunkSource(host, config, "r", 8, {}, FakeEncoder, pipeline)  # type: ignore[arg-type]
    return source, host


def _output(stream: dict[str, Any] | None = None) -> Any:
    video = np.zeros((1, 4, 128, 128, 3), dtype=np.float32)
    return SimpleNamespace(images=[video], multimodal_output={"metadata": {"stream": stream or {}}}, error=None)


def test_an_interaction_the_pipeline_has_no_handler_for_is_refused_before_forwarding() -> None:
    source, host = _source("WanPipeline")
    assert host.sink is not None
    host.sink.put("output", _output(), 0.0)
    source.next_chunk(4)
    source.admit_event(Interaction.prompt_update("e1", "a lantern", 1))
    failed = source.next_chunk(4)
    assert isinstance(failed, FailedEvent) and failed.event_id == "e1"
    assert "'prompt' is not supported by pipeline 'WanPipeline'" in str(failed)
    assert host.interactions == []  # never reached the engine, whose refusal would end the session


def test_an_error_through_generate_ends_the_session_naming_the_event() -> None:
    source, host = _source("HeliosPyramidPipeline")
    assert host.sink is not None
    host.sink.put("output", _output(), 0.0)
    source.next_chunk(4)
    source.admit_event(Interaction.prompt_update("e1", "a lantern", 1))
    assert [i["event_id"] for i in host.interactions] == ["e1"]
    host.sink.put("error", RuntimeError("Failed interaction for request r: boom"), 0.0)
    with pytest.raises(EngineError, match=r"event\(s\) 'e1' not yet started.*Failed interaction"):
        source.next_chunk(4)


def _standin(**kwargs: Any) -> StandInAsyncOmni:
    return StandInAsyncOmni("m", chunk_seconds=0.01, first_chunk_seconds=0.01, **kwargs)


def _params(num_frames: int) -> StandInSamplingParams:
    return StandInSamplingParams(width=128, height=128, num_frames=num_frames)  # on Helios-Distilled's grid


def test_the_standin_yields_helios_output_and_runs_the_wheels_interaction_code() -> None:
    async def body() -> list[Any]:
        engine = _standin()
        outputs = []
        async for out in engine.generate({"prompt": "p"}, request_id="r", sampling_params_list=[_params(99)]):
            outputs.append(out)
            if len(outputs) == 1:
                await engine.submit_interaction_async(
                    "r", interaction={"event_id": "e", "event": {"prompt": "q"}, "transition_chunks": 1}
                )
        return outputs

    outputs = asyncio.run(body())
    assert len(outputs) == 3 and outputs[-1].finished
    (video,) = outputs[0].images
    assert video.shape == (1, 33, 128, 128, 3) and video.dtype == np.float32
    assert video.min() >= 0.0 and video.max() <= 1.0
    assert "video" not in outputs[0].multimodal_output
    streams = [o.multimodal_output["metadata"]["stream"] for o in outputs]
    assert [s["generation_chunk_index"] for s in streams] == [0, 1, 2]
    assert streams[2]["started_event_ids"] == ["e"] and streams[2]["completed_event_ids"] == ["e"]


def test_the_standin_refuses_as_asyncomni_does() -> None:
    async def body() -> list[str]:
        engine = _standin()
        messages = []
        gen = engine.generate({"prompt": "p"}, request_id="r", sampling_params_list=[_params(33 * 5)])
        await gen.__anext__()
        for interaction in (
            {"event_id": "a", "event": {"prompt": ""}},
            {"event_id": "b", "event": {"prompt": "q"}, "transition_chunks": -1},
        ):
            with pytest.raises(ValueError) as info:  # synchronously, as `submit_interaction_async`
                await engine.submit_interaction_async("r", interaction=interaction)
            messages.append(str(info.value))
        with pytest.raises(ValueError, match="No active request"):
            await engine.submit_interaction_async("other", interaction={"event_id": "c", "event": {"prompt": "q"}})
        # the worker's refusal is only queued: it comes back through generate(), which then ends
        await engine.submit_interaction_async(
            "r", interaction={"event_id": "d", "event": {"prompt": "stand-in: refuse"}}
        )
        with pytest.raises(RuntimeError, match="Failed interaction for request r: stand-in pipeline cannot encode"):
            async for _ in gen:
                pass
        return messages

    assert asyncio.run(body()) == ["prompt must be non-empty", "transition_chunks must be >= 0"]


def test_the_standin_refuses_a_prompt_for_a_pipeline_without_the_prompt_modality() -> None:
    async def body() -> None:
        engine = _standin(model_class_name="WanPipeline")
        gen = engine.generate({"prompt": "p"}, request_id="r", sampling_params_list=[_params(33 * 5)])
        await gen.__anext__()
        await engine.submit_interaction_async("r", interaction={"event_id": "d", "event": {"prompt": "q"}})
        with pytest.raises(RuntimeError, match="'prompt' is not supported by pipeline 'WanPipeline'"):
            async for _ in gen:
                pass

    asyncio.run(body())
