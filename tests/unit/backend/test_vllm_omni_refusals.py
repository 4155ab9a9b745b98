"""What vLLM-Omni 0.30 refuses of an interaction, read in the pinned wheel, against what the
product refuses and what the stand-in engine (tests/support/omni_standin.py) refuses.

The wheel refuses in two places, both run here from its own code: `AsyncOmni.submit_interaction_async`
at once (compiled alone from `entrypoints/async_omni.py`), and the worker later
(`DiffusionModelRunner.submit_interaction`, compiled alone from `diffusion_model_runner.py`, over
the wheel's whole interaction package: `InteractionCoordinator.enqueue_parts`, the registry, the
handlers), whose refusal comes back through `generate()` and aborts the request. The product
refuses beforehand, at admission, what either would: the parser (`invalid_interaction`) what
`submit_interaction_async` refuses, and `rtvideo.core.interaction.refusal.interaction_refusal` with the
model rule table's data (`interaction_failed`, the session goes on) what the worker refuses of a
valid event. The stand-in must refuse exactly what the wheel refuses, in its words.
"""

from __future__ import annotations

import ast
import asyncio
import json
import logging
import queue
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import numpy as np
import pytest
import torch

from rtvideo.backend.loading.settings import BackendSettings
from rtvideo.backend.vllm_omni import model_rules
from rtvideo.backend.vllm_omni.engine import EngineError, EngineRequest
from rtvideo.backend.vllm_omni.interaction_rules import pipeline_class
from rtvideo.backend.vllm_omni.source import EngineChunkSource
from rtvideo.core.errors import ErrorCode, ProtocolError
from rtvideo.core.interaction.parse import parse_interaction
from rtvideo.core.interaction.refusal import NOTHING_APPLIED, interaction_refusal
from rtvideo.core.session_config import resolve_session_config
from rtvideo.core.start_request import validate_start
from tests.support.omni_standin import StandInAsyncOmni, StandInSamplingParams
from tests.support.probes import prompt_update
from tests.support.vllm_omni_wheel import Sampling, StepRequestState, load_interaction, wheel_source

ASYNC_OMNI = "vllm_omni/entrypoints/async_omni.py"
RUNNER = "vllm_omni/diffusion/worker/diffusion_model_runner.py"
ORCHESTRATOR = "vllm_omni/engine/orchestrator.py"
#: the classes the wheel's registry lists, and one it does not (a Wan-like pipeline: no handler)
PIPELINES = ("HeliosPipeline", "HeliosPyramidPipeline", "LingBotWorldCausalDMDPipeline", "WanPipeline")
VELOCITY = {"mode": "velocity", "data": {"translation": [0.0, 0.0, 0.05], "rotation": [0.0, 0.0, 0.0, 1.0]}}
TARGET = {"mode": "target", "data": {"translation": [1.0, 0.0, 0.0], "rotation": [0.0, 0.0, 0.0, 1.0]}}
#: `interaction` objects of `session.interaction` (each gets the event id "e")
INTERACTIONS: dict[str, dict[str, Any]] = {
    "prompt": {"event": {"prompt": "a harbour"}, "transition_chunks": 2},
    "prompt, no N": {"event": {"prompt": "a harbour"}},
    "empty prompt": {"event": {"prompt": ""}, "transition_chunks": 1},
    "negative N": {"event": {"prompt": "a harbour"}, "transition_chunks": -1},
    "camera": {"event": {"multi_modal_data": {"camera": VELOCITY}}},
    "camera target, N 0": {"event": {"multi_modal_data": {"camera": TARGET}}, "transition_chunks": 0},
    "prompt and camera": {"event": {"prompt": "a harbour", "multi_modal_data": {"camera": VELOCITY}}},
    "image": {"event": {"multi_modal_data": {"image": {"url": "https://example.com/a.png"}}}},
    "prompt and image": {"event": {"prompt": "a harbour", "multi_modal_data": {"image": {"url": "x"}}}},
}

#: a verdict: None (taken), or where it was refused and the wheel's words
Verdict = tuple[str, str] | None
SUBMIT, WORKER = "submit_interaction_async", "worker"


def _wheel_method(member: str, cls: str, name: str, **namespace: Any) -> Callable[..., Any]:
    """One method of a class of the wheel, compiled alone from its source (the module imports
    vLLM and the whole engine), with `namespace` as its globals."""
    tree = ast.parse(wheel_source(member))
    (owner,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls]
    (node,) = [n for n in owner.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == name]
    future = ast.parse("from __future__ import annotations").body  # as in the module: annotations stay text
    code = compile(ast.Module(body=[*future, node], type_ignores=[]), f"wheel!{member}", "exec", dont_inherit=True)
    scope: dict[str, Any] = {"logger": logging.getLogger("wheel"), **namespace}
    exec(code, scope)
    return cast(Callable[..., Any], scope[name])


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


def wheel_verdict(pipeline: str, interaction: dict[str, Any], request_id: str = "r") -> Verdict:
    """What the wheel does with `interaction` for a running request "r" of a single-stage
    diffusion engine whose worker runs `pipeline`: its own code from submission to the handlers."""
    coordinator = load_interaction()["coordinator"].InteractionCoordinator.build(
        _Pipeline(), SimpleNamespace(model_class_name=pipeline)
    )
    state = StepRequestState("internal-r", Sampling(), prompt_embeds=torch.zeros(3))  # a started request
    runner = SimpleNamespace(
        pipeline=_Pipeline(),
        _interaction_coordinator=coordinator,
        od_config=SimpleNamespace(streaming_output=True),
        _supports_step_mode=lambda: True,
        state_cache={"internal-r": state},
    )
    wheel_types = load_interaction()["types"]
    submit_to_worker = _wheel_method(
        RUNNER,
        "DiffusionModelRunner",
        "submit_interaction",
        time=time,
        cast=cast,
        InteractionPayload=wheel_types.InteractionPayload,
    )
    worker: list[Exception] = []

    class Engine:
        def get_stage_metadata(self, stage: int) -> Any:
            return SimpleNamespace(stage_type="diffusion")

        async def submit_interaction_async(self, internal_id: str, *, interaction: dict[str, Any]) -> None:
            try:  # the orchestrator hands it to the worker, whose refusal only comes back later
                submit_to_worker(runner, internal_id, interaction)
            except ValueError as exc:
                worker.append(exc)

    omni = SimpleNamespace(
        num_stages=1,
        engine=Engine(),
        request_states={"internal-r": SimpleNamespace(request_id="internal-r", external_request_id="r")},
        log_stats=False,
    )
    submit = _wheel_method(ASYNC_OMNI, "AsyncOmni", "submit_interaction_async")
    try:
        asyncio.run(submit(omni, request_id, interaction={"event_id": "e", **interaction}))
    except ValueError as exc:
        return (SUBMIT, str(exc))
    return (WORKER, str(worker[0])) if worker else None


def _params(pipeline: str) -> tuple[StandInSamplingParams, dict[str, Any]]:
    """A request the pipeline runs in two chunks or more (its rules: model_rules.py), and its prompt."""
    if pipeline == "LingBotWorldCausalDMDPipeline":  # 832x480 only, a first frame, 4 steps, 9 + 12 frames
        image = np.zeros((480, 832, 3), np.uint8)
        params = StandInSamplingParams(width=832, height=480, num_frames=21, num_inference_steps=4)
        return params, {"prompt": "p", "multi_modal_data": {"image": image}}
    return StandInSamplingParams(width=128, height=128, num_frames=99), {"prompt": "p"}


def standin_verdict(pipeline: str, interaction: dict[str, Any], request_id: str = "r") -> Verdict:
    """What the stand-in does with `interaction` for its running request "r" (after its first output)."""
    orchestrator_words = f"Failed interaction for request {request_id}: "

    async def body() -> Verdict:
        engine = StandInAsyncOmni("m", chunk_seconds=0.01, first_chunk_seconds=0.01, model_class_name=pipeline)
        params, prompt = _params(pipeline)
        gen = engine.generate(prompt, request_id="r", sampling_params_list=[params])
        await gen.__anext__()
        try:
            await engine.submit_interaction_async(request_id, interaction={"event_id": "e", **interaction})
        except ValueError as exc:
            await gen.aclose()
            return (SUBMIT, str(exc))
        try:
            async for _ in gen:
                pass
        except RuntimeError as exc:
            assert str(exc).startswith(orchestrator_words), exc
            return (WORKER, str(exc)[len(orchestrator_words) :])
        return None

    return asyncio.run(body())


def product_verdict(pipeline: str, interaction: dict[str, Any]) -> Verdict:
    """What the model does with it: the parser's refusal, else `interaction_refusal`'s, with the
    capabilities and the pipeline rules of a deployment of `pipeline` (its settings)."""
    size = ("832", "480") if pipeline == "LingBotWorldCausalDMDPipeline" else ("640", "384")
    settings = BackendSettings.from_parameters(
        {
            "generator": "vllm_omni",
            "width": size[0],
            "height": size[1],
            "vllm_omni_engine_args": json.dumps({"model_class_name": pipeline}),
        }
    )
    try:
        request = parse_interaction({"interaction": {"event_id": "e", **interaction}})
    except ProtocolError as exc:
        assert exc.code is ErrorCode.INVALID_INTERACTION
        return ("parser", exc.message)
    refusal = interaction_refusal(request, settings.interactions(), settings.pipeline_interactions())
    if refusal is None:
        return None
    assert refusal.code is ErrorCode.INTERACTION_FAILED and refusal.message.endswith(f"; {NOTHING_APPLIED}")
    return ("interaction_failed", refusal.message.removesuffix(f"; {NOTHING_APPLIED}"))


def test_the_wheels_own_code_is_what_runs() -> None:
    """The checks compiled from the wheel are the ones it ships (nothing here restates them)."""
    assert "interaction requires single-stage diffusion" in wheel_source(ASYNC_OMNI)
    assert 'error=f"Failed interaction for request {request_id}: {exc}"' in wheel_source(ORCHESTRATOR)
    assert wheel_verdict("HeliosPipeline", INTERACTIONS["prompt"]) is None
    assert wheel_verdict("HeliosPipeline", INTERACTIONS["prompt"], request_id="other") == (
        SUBMIT,
        "No active request for interaction: 'other'",
    )


@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("name", list(INTERACTIONS))
def test_the_product_refuses_first_what_the_wheel_refuses(pipeline: str, name: str) -> None:
    """Whatever the wheel refuses never reaches it: what `submit_interaction_async` refuses is
    `invalid_interaction` at the parser; what the worker refuses is `interaction_failed` from
    `interaction_refusal`, in the worker's words; what it takes, the model forwards."""
    interaction = INTERACTIONS[name]
    wheel = wheel_verdict(pipeline, interaction)
    product = product_verdict(pipeline, interaction)
    if wheel is None:
        assert product is None
    elif wheel[0] == SUBMIT:
        assert product is not None and product[0] == "parser", (wheel, product)
    else:
        assert product == ("interaction_failed", wheel[1])


@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("name", list(INTERACTIONS))
def test_the_standin_refuses_exactly_what_the_wheel_refuses(pipeline: str, name: str) -> None:
    """Where, and in which words: at submission, or in the worker (through `generate()`, wrapped
    in the orchestrator's words, as the wheel's orchestrator wraps it)."""
    assert standin_verdict(pipeline, INTERACTIONS[name]) == wheel_verdict(pipeline, INTERACTIONS[name])


def test_the_standin_refuses_an_unknown_request_as_the_wheel_does() -> None:
    interaction = INTERACTIONS["prompt"]
    wheel = wheel_verdict("HeliosPyramidPipeline", interaction, request_id="other")
    assert standin_verdict("HeliosPyramidPipeline", interaction, request_id="other") == wheel


def test_the_pipeline_class_comes_from_engine_args_or_model_index(tmp_path: Path) -> None:
    assert pipeline_class("x", {"model_class_name": "HeliosPipeline"}) == "HeliosPipeline"
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "HeliosPyramidPipeline"}))
    assert pipeline_class(str(tmp_path), {}) == "HeliosPyramidPipeline"
    assert pipeline_class(str(tmp_path / "absent"), {}) is None


def test_the_table_gives_each_pipeline_its_registrys_modalities() -> None:
    """By class; a class the table does not list has none (the registry lists only the table's,
    tests/unit/backend/test_vllm_omni_model_rules.py); without a class, the model id's entry."""
    registry = load_interaction()["registry"].STRUCTURED_HANDLER_REGISTRY
    for pipeline in PIPELINES:
        rules = model_rules.pipeline_interactions("m", pipeline)
        assert rules is not None and rules.pipeline == pipeline
        assert rules.modalities == frozenset(registry.get(pipeline, {})), pipeline
    by_id = model_rules.pipeline_interactions("BestWishYsh/Helios-Distilled", None)
    assert by_id is not None and (by_id.pipeline, by_id.modalities) == ("HeliosPyramidPipeline", {"prompt"})
    assert model_rules.pipeline_interactions("someone/else", None) is None  # unknown: the engine decides


class FakeHost:
    def __init__(self) -> None:
        self.interactions: list[dict[str, Any]] = []
        self.sink: queue.Queue[tuple] | None = None

    def start_request(self, wanted: EngineRequest) -> None:
        self.sink = wanted.sink

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


def _source() -> tuple[EngineChunkSource, FakeHost]:
    settings = BackendSettings.from_parameters(
        {"generator": "vllm_omni", "width": "128", "height": "128", "frames_per_chunk": "4"}
    )
    config = resolve_session_config(validate_start({"prompt": "p"}), settings.capabilities("realtime_video"))
    host = FakeHost()
    source = EngineChunkSource(host, config, "r", 8, {}, FakeEncoder)  # type: ignore[arg-type]
    return source, host


def _output(stream: dict[str, Any] | None = None) -> Any:
    video = np.zeros((1, 4, 128, 128, 3), dtype=np.float32)
    return SimpleNamespace(images=[video], multimodal_output={"metadata": {"stream": stream or {}}}, error=None)


def test_an_error_through_generate_ends_the_session_naming_the_event() -> None:
    source, host = _source()
    assert host.sink is not None
    host.sink.put("output", _output(), 0.0)
    source.next_chunk(4)
    source.admit_event(prompt_update("e1", "a lantern", 1))
    assert [i["event_id"] for i in host.interactions] == ["e1"]
    host.sink.put("error", RuntimeError("Failed interaction for request r: boom"), 0.0)
    with pytest.raises(EngineError, match=r"event\(s\) 'e1' not yet started.*Failed interaction"):
        source.next_chunk(4)


def test_the_standin_yields_helios_output_and_runs_the_wheels_interaction_code() -> None:
    async def body() -> list[Any]:
        engine = StandInAsyncOmni("m", chunk_seconds=0.01, first_chunk_seconds=0.01)
        params = StandInSamplingParams(width=128, height=128, num_frames=99)  # on Helios-Distilled's grid
        outputs = []
        async for out in engine.generate({"prompt": "p"}, request_id="r", sampling_params_list=[params]):
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
