"""Every field of vLLM-Omni 0.30's `VideoGenerationRequest` is a `session.start` field here.

The list is read from the pinned wheel (`entrypoints/openai/protocol/videos.py`, the class's
annotated fields), so a field a new vLLM-Omni adds fails this test rather than a client's
start. Each is either used or reported in `config.ignored_fields`; `lora` is passed on by
the `vllm_omni` generator (in `config.sampling`, then onto the engine's request).
"""

from __future__ import annotations

import ast
import json
from types import SimpleNamespace
from typing import Any

import pytest

from rtvideo.backend.loading.settings import BackendSettings
from rtvideo.backend.vllm_omni.engine import apply_lora
from rtvideo.core import start_request
from rtvideo.core.errors import ErrorCode, ProtocolError
from rtvideo.core.session_config import ModelCapabilities, resolve_session_config
from rtvideo.core.start_request import check_first_message, validate_start
from tests.support.vllm_omni_wheel import wheel_source

#: fields of the request model the streaming endpoint takes out before building it, or that
#: our start names otherwise: `format` (popped), `type`, `sampling_params` (lifted)
OURS_ONLY = {"type", "format", "sampling_params", "prompts", "interpolation"}
OURS_ONLY |= {"metrics"}  # beyond vLLM-Omni: in-band timing (docs/protocol.md §3.5)
OURS_ONLY |= {"streaming_buffer_seconds"}  # vLLM-Omni after 0.30 (its realtime clients); docs/protocol.md §2.1
OURS_ONLY |= {"streaming_pacing"}  # vLLM-Omni 0.32 (StreamingPacingConfig); docs/protocol.md §2.1


def wheel_request_fields() -> set[str]:
    tree = ast.parse(wheel_source("vllm_omni/entrypoints/openai/protocol/videos.py"))
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "VideoGenerationRequest"]
    return {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}


def test_every_field_of_the_wheels_request_is_a_start_field() -> None:
    real = wheel_request_fields()
    assert {"lora", "user", "quality", "prompt", "extra_params"} <= real  # the parse found the class
    assert real - start_request.START_FIELDS == set()
    assert start_request.START_FIELDS - real <= OURS_ONLY


def test_the_quality_levels_are_the_wheels() -> None:
    source = wheel_source("vllm_omni/inputs/data.py")
    levels = ", ".join(f'"{level}"' for level in start_request.QUALITY_LEVELS)
    assert f"DIFFUSION_QUALITY_LEVELS: tuple[str, ...] = ({levels})" in source


EXAMPLES: dict[str, Any] = {
    "user": "user-42",
    "aspect_ratio": "16:9",
    "frame_interpolation_model_path": "elfgum/RIFE-4.22.lite",
    "quality": "high",
    "short_edge": 480,
    "num_outputs_per_prompt": 1,
    "frame_interpolation_exp": 1,
    "start_time_seconds": 0.0,
    "sound_duration": 2.5,
    "frame_interpolation_scale": 0.5,
    "generate_sound": False,
    "enable_frame_interpolation": False,
    "return_stage_metrics": True,
    "lora": {"name": "style", "path": "/loras/style", "scale": 0.8},
    "video_params": {"width": 64},
    "video_reference": [{"video_url": "https://example.com/a.mp4"}],
    "audio_reference": {"audio_url": "https://example.com/a.wav"},
}


def builtin_caps() -> ModelCapabilities:
    return BackendSettings.from_parameters({}).capabilities("realtime_video")


def test_each_field_is_accepted_and_reported_as_ignored_by_the_builtin_generator() -> None:
    assert set(EXAMPLES) == set(start_request.REQUEST_FIELDS)
    start = validate_start(check_first_message(json.dumps({"type": "session.start", "prompt": "x", **EXAMPLES})))
    config = resolve_session_config(start, builtin_caps())
    assert config.to_json()["ignored_fields"] == sorted(EXAMPLES)


def test_the_vllm_omni_generator_passes_lora_on() -> None:
    settings = BackendSettings.from_parameters({"generator": "vllm_omni", "width": "640", "height": "384"})
    start = validate_start(
        check_first_message(json.dumps({"type": "session.start", "prompt": "x", "lora": EXAMPLES["lora"], "user": "u"}))
    )
    config = resolve_session_config(start, settings.capabilities("realtime_video"))
    assert config.to_json()["ignored_fields"] == ["user"]
    assert config.sampling["lora"] == EXAMPLES["lora"]
    params = SimpleNamespace()
    apply_lora(params, config.sampling["lora"])  # no vllm-omni here: set as sent
    assert params.lora_request == EXAMPLES["lora"]


def test_a_start_without_them_is_unchanged() -> None:
    start = validate_start(check_first_message('{"type": "session.start", "prompt": "x", "user": null, "lora": null}'))
    assert start.request_fields == {}
    assert resolve_session_config(start, builtin_caps()).ignored_fields == ()


@pytest.mark.parametrize(
    "name,value,fragment",
    [
        ("user", 5, "must be a string"),
        ("quality", "best", "quality must be one of"),
        ("num_outputs_per_prompt", 11, "between 1 and 10"),
        ("short_edge", 0, "between 1"),
        ("sound_duration", 0, "greater than 0"),
        ("start_time_seconds", -1, "between 0"),
        ("generate_sound", "yes", "true or false"),
        ("lora", "style", "must be an object"),
        ("video_reference", ["a.mp4"], "array of objects"),
    ],
)
def test_malformed_values_are_invalid_start(name: str, value: Any, fragment: str) -> None:
    with pytest.raises(ProtocolError) as info:
        validate_start(check_first_message(json.dumps({"type": "session.start", "prompt": "x", name: value})))
    assert info.value.code is ErrorCode.INVALID_START and fragment in info.value.message


def test_video_start_with_them_matches_the_server_schema() -> None:
    from rtvideo.core import server_messages as p
    from tests.support.streams import check_server_message

    start = validate_start(check_first_message(json.dumps({"type": "session.start", "prompt": "x", **EXAMPLES})))
    config = resolve_session_config(start, builtin_caps())
    check_server_message(p.video_start(p.new_request_id(), "m4s", config.to_json()))
