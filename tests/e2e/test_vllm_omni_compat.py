"""Clients written for vLLM-Omni's `/v1/realtime/video` work unchanged: served model names
(`--served-model-name`), sampling fields the built-in generator does not use
(`config.ignored_fields`), and the same fields honoured by the `vllm_omni` generator
(merged over the model's preset, `config.sampling`, none ignored).

The end-to-end test plays vLLM-Omni's example client
(examples/online_serving/streaming_video_generation/streaming_video_client.py): the same
`session.start` its defaults build (the Helios-Distilled model id, 640x384 at 16 fps, 429
frames, guidance_scale 1.0, seed 42, the Helios preset in extra_params), its scheduled
`session.interaction` shape, and its receive loop (metadata text, then the binary chunk),
through the real proxy and Triton. Only the prompt text differs (the example's default
prompt is a long paragraph about a reef; this one is ours).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import connect

from rtvideo import cli
from rtvideo.backend.loading.settings import BackendSettings
from rtvideo.core.errors import ErrorCode, ProtocolError
from rtvideo.core.session_config import ModelCapabilities, resolve_session_config
from rtvideo.core.start_request import SAMPLING_FIELDS, check_first_message, validate_start
from rtvideo.triton.model_repo import derive_model, read_parameters
from tests.support.omni_example_client import play_example_client
from tests.support.proxy_client import first_message_answers
from tests.support.proxy_host import run
from tests.support.streams import (
    FAST_MODEL,
    HELIOS_ID,
    PACED_MODEL,
    Transcript,
    check_stream_rules,
    decode,
)

#: what vLLM-Omni's example client sends with its defaults (`build_session_start`), in its order
HELIOS_DISTILLED_EXTRA_PARAMS = {
    "is_enable_stage2": True,
    "pyramid_num_stages": 3,
    "pyramid_num_inference_steps_list": [1, 1, 1],
    "is_amplify_first_chunk": True,
}
VLLM_OMNI_START = {
    "type": "session.start",
    "model": HELIOS_ID,
    "prompt": (
        "A small striped fish drifts over a coral shelf in clear blue water, sunlight rippling on the sand "
        "below, sea fans swaying in the current. A close-up shot with gentle movement."
    ),
    "width": 640,
    "height": 384,
    "fps": 16,
    "num_frames": 429,
    "guidance_scale": 1.0,
    "seed": 42,
    "extra_params": dict(HELIOS_DISTILLED_EXTRA_PARAMS),
}
IGNORED = sorted(["guidance_scale", *(f"extra_params.{key}" for key in HELIOS_DISTILLED_EXTRA_PARAMS)])


async def vllm_omni_example_client(
    url: str, payload: dict[str, Any], prompt_updates: list[dict[str, Any]]
) -> Transcript:
    """The example client with `--prompt-updates`: each update at its time after video.start."""
    scheduled = [
        (
            update["at"],
            {
                "type": "session.interaction",
                "interaction": {
                    "event_id": f"scheduled-{update['at']:.3f}",
                    "event": {"prompt": update["prompt"]},
                    "transition_chunks": update.get("transition_chunks", 3),
                },
            },
        )
        for update in prompt_updates
    ]
    return await play_example_client(url, payload, scheduled)


def test_vllm_omni_example_client_session(proxies) -> None:
    """Its default start is accepted as sent, the knobs the built-in generator does not use are
    reported (the vllm_omni generator uses them all: the test below), every chunk decodes."""
    updates = [{"at": 0.0, "prompt": "A sea turtle glides past the reef"}]
    t = run(vllm_omni_example_client(proxies.url(), VLLM_OMNI_START, updates), 180)
    check_stream_rules(t)  # every message also matched rtvideo/schemas/server_messages.json
    start = t.messages[0]
    config = start["config"]
    assert config["ignored_fields"] == IGNORED
    assert (config["width"], config["height"], config["fps"], config["num_frames"], config["seed"]) == (
        640,
        384,
        16,
        429,
        42,
    )
    assert config["model"] == FAST_MODEL  # the canonical name, whatever served name was asked for
    assert not t.of_type("error")
    assert [m["event_id"] for m in t.of_type("session.interaction.queued")] == ["scheduled-0.000"]
    done = t.messages[-1]
    assert done["type"] == "session.done" and done["stopped"] is False and done["chunks"] == len(t.pairs)
    assert sum(m["num_frames"] for m in t.media) == 429
    assert decode(t.video).shape == (429, 384, 640, 3)


def test_model_names_without_served_names_are_the_models_own(proxies) -> None:
    """The paced test model has no served_model_names: its own name and rtvideo-builtin pass,
    the Helios id is model_mismatch naming what is served."""
    url = proxies.url(model=PACED_MODEL)
    error, done = run(first_message_answers(url, {**VLLM_OMNI_START}))
    assert error["code"] == "model_mismatch" and done["type"] == "session.done"
    assert repr(PACED_MODEL) in error["message"] and "'rtvideo-builtin'" in error["message"]
    for name in (PACED_MODEL, "rtvideo-builtin"):

        async def body(name: str = name) -> dict[str, Any]:
            async with connect(url, proxy=None) as ws:
                await ws.send(json.dumps({"type": "session.start", "prompt": "x", "model": name, "num_frames": 9}))
                return json.loads(await asyncio.wait_for(ws.recv(), 30))

        start = run(body())
        assert start["type"] == "video.start" and start["config"]["model"] == PACED_MODEL
        assert start["config"]["ignored_fields"] == []


@pytest.mark.parametrize(
    "field,value",
    [
        ("guidance_scale", "1.0"),
        ("guidance_scale", -1),
        ("guidance_scale_2", 2e6),
        ("boundary_ratio", 1.5),
        ("flow_shift", "3"),
        ("true_cfg_scale", True),
        ("num_inference_steps", 2.5),
        ("negative_prompt", ["blur"]),
        ("extra_params", [1]),
    ],
)
def test_malformed_sampling_fields_are_still_invalid_start(proxies, field: str, value: Any) -> None:
    error, done = run(first_message_answers(proxies.url(), {**VLLM_OMNI_START, field: value}))
    assert error["code"] == "invalid_start" and field in error["message"]
    assert done["type"] == "session.done" and done["chunks"] == 0


# --- capabilities, settings and flags (no server) -----------------------------------------------
def caps(**kwargs: Any) -> ModelCapabilities:
    return ModelCapabilities(
        model_names=("m", "rtvideo-builtin"),
        width=64,
        height=64,
        fps=16,
        frames_per_chunk=9,
        default_transition_chunks=3,
        **kwargs,
    )


def test_ignored_fields_follow_the_generators_capabilities() -> None:
    start = validate_start(
        check_first_message(
            json.dumps(
                {
                    **VLLM_OMNI_START,
                    "model": None,
                    "negative_prompt": "blur",
                    "boundary_ratio": 0.9,
                    "sampling_params": {"flow_shift": 5.0, "strength": 0.4},
                }
            )
        )
    )
    everything = ["boundary_ratio", "extra_params.strength", *IGNORED, "flow_shift", "negative_prompt"]
    assert resolve_session_config(start, caps()).ignored_fields == tuple(sorted(everything))
    uses_some = caps(
        sampling_fields=frozenset({"guidance_scale", "flow_shift"}),
        extra_params=frozenset({"pyramid_num_stages", "strength"}),
    )
    assert list(resolve_session_config(start, uses_some).ignored_fields) == sorted(
        set(everything) - {"guidance_scale", "flow_shift", "extra_params.pyramid_num_stages", "extra_params.strength"}
    )
    plain = resolve_session_config(
        validate_start(check_first_message('{"type": "session.start", "prompt": "x"}')), caps()
    )
    assert plain.ignored_fields == () and plain.to_json()["ignored_fields"] == []
    assert set(SAMPLING_FIELDS) == {
        "negative_prompt",
        "num_inference_steps",
        "guidance_scale",
        "guidance_scale_2",
        "boundary_ratio",
        "flow_shift",
        "true_cfg_scale",
    }


def test_the_vllm_omni_generator_honours_the_example_clients_sampling() -> None:
    """vllm_omni passes every sampling field and extra_params key on, as vLLM-Omni does: nothing
    of the example client's start is ignored, and config.sampling says what the engine runs with."""
    settings = BackendSettings.from_parameters({"generator": "vllm_omni", "width": "640", "height": "384"})
    start = validate_start(
        check_first_message(json.dumps({**VLLM_OMNI_START, "negative_prompt": "blur", "num_inference_steps": 2}))
    )
    config = resolve_session_config(start, settings.capabilities("realtime_video"))
    assert config.ignored_fields == () and config.to_json()["ignored_fields"] == []
    assert config.to_json()["sampling"] == {
        "guidance_scale": 1.0,
        "negative_prompt": "blur",
        "num_inference_steps": 2,
        "extra_params": HELIOS_DISTILLED_EXTRA_PARAMS,
    }
    assert config.num_frames == 429  # below the length cap: as asked
    # the same start without its preset: the model's preset fills it in
    bare = {k: v for k, v in VLLM_OMNI_START.items() if k not in ("extra_params", "guidance_scale")}
    preset = resolve_session_config(
        validate_start(check_first_message(json.dumps(bare))), settings.capabilities("realtime_video")
    )
    assert preset.to_json()["sampling"] == {"guidance_scale": 1.0, "extra_params": HELIOS_DISTILLED_EXTRA_PARAMS}


def test_seconds_as_vllm_omni_sends_it() -> None:
    assert (
        validate_start(
            check_first_message(json.dumps({"type": "session.start", "prompt": "x", "seconds": "5"}))
        ).seconds
        == 5.0
    )
    for bad in ("2.5", "0", "five", "05"):
        with pytest.raises(ProtocolError) as info:
            validate_start(check_first_message(json.dumps({"type": "session.start", "prompt": "x", "seconds": bad})))
        assert info.value.code is ErrorCode.INVALID_START


def test_served_model_names_setting() -> None:
    default = BackendSettings.from_parameters({})
    assert default.served_names("realtime_video") == ("realtime_video", "rtvideo-builtin")
    named = BackendSettings.from_parameters({"served_model_names": f" realtime_video , {HELIOS_ID} "})
    assert named.served_model_names == ("realtime_video", HELIOS_ID)
    assert named.capabilities("realtime_video").model_names == ("realtime_video", HELIOS_ID, "rtvideo-builtin")
    assert BackendSettings.from_parameters({"served_model_names": HELIOS_ID}).served_names("x") == (
        HELIOS_ID,
        "rtvideo-builtin",
    )
    with pytest.raises(ProtocolError) as info:
        resolve_session_config(
            validate_start(check_first_message(json.dumps({**VLLM_OMNI_START, "model": "realtime_video"}))),
            BackendSettings.from_parameters({"served_model_names": HELIOS_ID}).capabilities("realtime_video"),
        )
    assert info.value.code is ErrorCode.MODEL_MISMATCH  # like vLLM: served names replace the model's own
    for bad in ('a"b', "with space", "a,b", ""):
        with pytest.raises(ValueError):
            BackendSettings(served_model_names=(bad,)).check()


def test_served_model_name_flag_reaches_config_pbtxt(tmp_path: Path) -> None:
    """`rtvideo serve --served-model-name` is repeatable; the names travel comma-separated."""
    args = cli.build_parser().parse_args(
        ["serve", "--served-model-name", "realtime_video", "--served-model-name", HELIOS_ID]
    )
    overrides = cli.model_overrides(args)
    assert overrides == {"served_model_names": f"realtime_video,{HELIOS_ID}"}
    cli.check_settings(args)
    derived = derive_model(tmp_path, "realtime_video", overrides)
    settings = BackendSettings.from_parameters(read_parameters(derived))
    assert settings.served_names("realtime_video") == ("realtime_video", HELIOS_ID, "rtvideo-builtin")
    assert read_parameters()["served_model_names"] == ""  # shipped: the model's own name
    bad = cli.build_parser().parse_args(["serve", "--served-model-name", 'x"y'])
    with pytest.raises(ValueError):
        cli.check_settings(bad)
