"""The `vllm_omni` generator against the pinned wheel's own code: the real-time preset per model,
a start's sampling fields honoured, a bounded engine request, and `OmniInteractionEvent`.

Everything is read with `ast` from the wheel (nothing of it is imported: it needs vLLM and CUDA).
"""

from __future__ import annotations

import ast
import json
import queue
from typing import Any

import pytest

from rtvideo.backend.loading.settings import BackendSettings
from rtvideo.backend.vllm_omni import presets
from rtvideo.backend.vllm_omni.engine import EngineHost, EngineRequest, engine_prompt
from rtvideo.backend.vllm_omni.output_queue import OutputQueue
from rtvideo.backend.vllm_omni.source import EngineSources
from rtvideo.core.event_types import EVENT_FIELDS
from rtvideo.core.session_config import SessionConfig, resolve_session_config
from rtvideo.core.start_request import SAMPLING_FIELDS, check_first_message, validate_start
from rtvideo.triton.model_repo import read_parameters
from tests.support.omni_standin import StandInSamplingParams
from tests.support.vllm_omni_wheel import wheel_source

HELIOS = "BestWishYsh/Helios-Distilled"
HELIOS_PRESET_EXTRA = {
    "is_enable_stage2": True,
    "pyramid_num_stages": 3,
    "pyramid_num_inference_steps_list": [1, 1, 1],
    "is_amplify_first_chunk": True,
}
#: vLLM's `TextPrompt` keys (vllm/inputs: `prompt` and `_PromptOptions`), the base of
#: `OmniTextPrompt`; vLLM itself is not in the wheel
VLLM_TEXT_PROMPT_KEYS = {"prompt", "multi_modal_data", "mm_processor_kwargs", "multi_modal_uuids", "cache_salt"}


def class_node(source: str, name: str) -> ast.ClassDef:
    tree = ast.parse(source)
    return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)


def annotated(node: ast.ClassDef) -> set[str]:
    return {n.target.id for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}


def sampling_params_fields() -> set[str]:
    return annotated(class_node(wheel_source("vllm_omni/inputs/data.py"), "OmniDiffusionSamplingParams"))


def start(**fields: Any) -> Any:
    return validate_start(check_first_message(json.dumps({"type": "session.start", "prompt": "a reef", **fields})))


def omni(**params: str) -> BackendSettings:
    return BackendSettings.from_parameters({"generator": "vllm_omni", "width": "640", "height": "384", **params})


class _Capturing:
    """An engine that keeps the params each request hands it, and makes nothing."""

    def __init__(self, **_: Any) -> None:
        self.default_sampling_params_list = [StandInSamplingParams(extra_args={"d": 0})]
        self.given: queue.Queue[Any] = queue.Queue()

    async def generate(self, prompt: Any, request_id: str = "", *, sampling_params_list: Any = None, **_: Any) -> Any:
        self.given.put(sampling_params_list[0])
        return
        yield  # an async generator with no output

    async def abort(self, request_id: str, *, timeout: float | None = None) -> None:
        return None

    async def check_health(self) -> None:
        return None

    def shutdown(self, timeout: float | None = None) -> None:
        return None


def engine_params(config: SessionConfig, num_frames: int, preset: dict[str, Any]) -> Any:
    """The params an `EngineHost` hands its engine for a request of `config`."""
    engines: list[_Capturing] = []

    def engine_of(**kwargs: Any) -> _Capturing:
        engines.append(_Capturing(**kwargs))
        return engines[-1]

    host = EngineHost(engine_of, model="m", engine_args={}, health_seconds=60)
    try:
        host.start_request(EngineRequest("r", {"prompt": "p"}, config, num_frames, preset, OutputQueue()))
        return engines[0].given.get(timeout=10)
    finally:
        host.shutdown()


# --- real-time defaults, the start's sampling honoured -------------------------------
def test_the_helios_preset_uses_names_the_wheels_helios_pipeline_reads() -> None:
    preset = presets.VLLM_OMNI_PRESETS[HELIOS]
    assert preset == {"guidance_scale": 1.0, "extra_params": HELIOS_PRESET_EXTRA}
    pipeline = ast.parse(wheel_source("vllm_omni/diffusion/models/helios/pipeline_helios.py"))
    read = {  # extra.get("KEY", ...) and extra["KEY"] in the pipeline
        n.args[0].value
        for n in ast.walk(pipeline)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr == "get"
        and isinstance(n.func.value, ast.Name)
        and n.func.value.id == "extra"
        and n.args
        and isinstance(n.args[0], ast.Constant)
    }
    body = ast.parse(wheel_source("vllm_omni/model_extras/helios.py"))
    declared = {n.value for n in ast.walk(body) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    for key in HELIOS_PRESET_EXTRA:
        assert key in read, f"pipeline_helios.py does not read extra_args[{key!r}]"
        assert key in declared, f"HELIOS_EXTRA_BODY_PARAMS lacks {key!r}"
    assert set(preset) - {"extra_params"} <= sampling_params_fields()
    # without the preset, Helios runs with guidance 5.0 unless guidance_scale is provided
    assert 'float(extra.get("guidance_scale", 5.0))' in wheel_source(
        "vllm_omni/diffusion/models/helios/pipeline_helios.py"
    )
    assert "guidance_scale_provided = True" in wheel_source("vllm_omni/diffusion/request.py")


def test_every_sampling_field_has_its_place_in_the_wheels_request() -> None:
    """As the wheel's streaming endpoint builds a request: sampling params fields, flow_shift in
    extra_args, negative_prompt in the prompt."""
    fields = sampling_params_fields()
    stream = wheel_source("vllm_omni/entrypoints/openai/serving_video_output_stream.py")
    for name in SAMPLING_FIELDS:
        if name == "negative_prompt":
            assert 'prompt["negative_prompt"] = request.negative_prompt' in stream
            assert "negative_prompt" in annotated(
                class_node(wheel_source("vllm_omni/inputs/data.py"), "OmniTextPrompt")
            )
        elif name == "flow_shift":
            assert 'gen_params.extra_args["flow_shift"] = request.flow_shift' in stream
        else:
            assert name in fields and f"gen_params.{name} = request.{name}" in stream, name
    assert "gen_params.extra_args.update(request.extra_params)" in stream


def test_without_deployer_params_a_session_runs_the_models_preset() -> None:
    settings = omni()
    assert settings.vllm_omni_extra_params == "auto" and settings.extra_params() == HELIOS_PRESET_EXTRA
    assert read_parameters()["vllm_omni_extra_params"] == "auto"  # shipped: the preset
    config = resolve_session_config(start(), settings.capabilities("m"))
    assert config.ignored_fields == ()
    assert config.to_json()["sampling"] == {"guidance_scale": 1.0, "extra_params": HELIOS_PRESET_EXTRA}
    # a model without a preset: the engine's defaults; a deployer's object replaces the preset's extras
    assert omni(vllm_omni_model="some/model").sampling_preset() == {"extra_params": {}}
    own = omni(vllm_omni_extra_params='{"pyramid_num_inference_steps_list": [2, 2, 2]}')
    assert own.sampling_preset() == {
        "guidance_scale": 1.0,
        "extra_params": {"pyramid_num_inference_steps_list": [2, 2, 2]},
    }


def test_a_starts_sampling_fields_are_merged_over_the_preset_and_none_is_ignored() -> None:
    given = start(
        guidance_scale=2.5,
        num_inference_steps=4,
        negative_prompt="blur",
        flow_shift=5.0,
        true_cfg_scale=3.0,
        guidance_scale_2=1.5,
        boundary_ratio=0.8,
        extra_params={"pyramid_num_inference_steps_list": [2, 2, 2], "zero_steps": 1},
    )
    config = resolve_session_config(given, omni().capabilities("m"))
    assert config.ignored_fields == ()
    assert config.to_json()["sampling"] == {
        "guidance_scale": 2.5,
        "num_inference_steps": 4,
        "negative_prompt": "blur",
        "flow_shift": 5.0,
        "true_cfg_scale": 3.0,
        "guidance_scale_2": 1.5,
        "boundary_ratio": 0.8,
        "extra_params": {**HELIOS_PRESET_EXTRA, "pyramid_num_inference_steps_list": [2, 2, 2], "zero_steps": 1},
    }
    # what the engine receives: its defaults with all of it set, as the streaming endpoint would
    params = engine_params(config, 33, {"preset_only": 1})
    assert (params.guidance_scale, params.num_inference_steps, params.true_cfg_scale) == (2.5, 4, 3.0)
    assert (params.guidance_scale_2, params.boundary_ratio, params.num_frames) == (1.5, 0.8, 33)
    assert params.extra_args == {
        "d": 0,
        "preset_only": 1,
        "flow_shift": 5.0,
        **HELIOS_PRESET_EXTRA,
        "pyramid_num_inference_steps_list": [2, 2, 2],
        "zero_steps": 1,
    }
    assert engine_prompt({"prompt": "a reef"}, config) == {"prompt": "a reef", "negative_prompt": "blur"}
    plain = resolve_session_config(start(), omni().capabilities("m"))
    assert engine_params(plain, 33, {}).guidance_scale == 1.0  # the preset's: no CFG
    assert engine_prompt({"prompt": "a reef"}, plain) == {"prompt": "a reef"}


def test_the_builtin_generator_still_reports_sampling_fields_as_ignored() -> None:
    config = resolve_session_config(
        start(guidance_scale=1.0, extra_params={"k": 1}), BackendSettings().capabilities("m")
    )
    assert config.ignored_fields == ("extra_params.k", "guidance_scale")
    assert "sampling" not in config.to_json() and config.num_frames is None


# --- bounded GPU memory --------------------------------------------------------------
def test_the_default_cap_comes_from_the_stated_memory_bound() -> None:
    assert presets.HELIOS_FRAME_BYTES == 640 * 384 * 3 * 4 == 2_949_120
    # 4 GiB / 2,949,120 B = 1456 frames, cut to whole 33-frame chunks: a Helios request runs
    # ceil(num_frames / 33) chunks, so 1456 would run 45 (1485 frames, past the bound)
    assert 4 * 2**30 // 2_949_120 == 1456
    assert presets.DEFAULT_MAX_REQUEST_FRAMES == 44 * 33 == 1452
    assert BackendSettings().vllm_omni_max_request_frames == 1452
    assert read_parameters()["vllm_omni_max_request_frames"] == "1452"
    with pytest.raises(ValueError, match="vllm_omni_max_request_frames"):
        omni(vllm_omni_max_request_frames="0")


@pytest.mark.parametrize(
    "fields,expected",
    [({}, 1452), ({"num_frames": 429}, 429), ({"num_frames": 100_000}, 1452), ({"seconds": "3600"}, 1452)],
)
def test_a_session_gets_its_length_or_the_default_capped(fields: dict, expected: int) -> None:
    caps = omni().capabilities("m")
    config = resolve_session_config(start(**fields), caps)
    assert config.num_frames == expected and config.to_json()["num_frames"] == expected  # video.start says it
    small = resolve_session_config(start(**fields), omni(vllm_omni_max_request_frames="66").capabilities("m"))
    assert small.num_frames == min(expected, 66)


def test_the_engine_request_is_never_sized_for_an_hour() -> None:
    sources = EngineSources(None, {}, 3600.0, None, max_request_frames=1452)  # type: ignore[arg-type]
    base = resolve_session_config(start(), omni().capabilities("m"))
    assert sources.engine_frames(base) == 1452
    open_ended = SessionConfig(**{**base.__dict__, "num_frames": None})
    assert sources.engine_frames(open_ended) == 1452  # not 3600 s x 16 fps = 57,600
    assert sources.engine_frames(SessionConfig(**{**base.__dict__, "num_frames": 10})) == 10
    assert sources.engine_frames(SessionConfig(**{**base.__dict__, "num_frames": 99_999})) == 1452


def test_the_fallbacks_keys_are_the_real_types() -> None:
    data = wheel_source("vllm_omni/inputs/data.py")
    event = class_node(data, "OmniInteractionEvent")
    assert [b.id for b in event.bases if isinstance(b, ast.Name)] == ["OmniTextPrompt"] and not annotated(event)
    omni_prompt = class_node(data, "OmniTextPrompt")
    assert [b.id for b in omni_prompt.bases if isinstance(b, ast.Name)] == ["TextPrompt"]
    assert "from vllm.inputs import EmbedsPrompt, PromptType, TextPrompt, TokensPrompt" in data
    real = VLLM_TEXT_PROMPT_KEYS | annotated(omni_prompt)
    assert real == EVENT_FIELDS  # the keys our copy of the type takes, as the real one
