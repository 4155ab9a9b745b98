"""generator=vllm_omni's small parts: limits, settings, JSON parameters in config.pbtxt, frames."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest
import torch

from rtvideo.backend.loading.settings import BackendSettings
from rtvideo.backend.vllm_omni.engine import EngineError
from rtvideo.backend.vllm_omni.frames import rgb_frames, stream_metadata
from rtvideo.core.errors import ProtocolError
from rtvideo.core.session_config import resolve_session_config
from rtvideo.core.start_request import check_first_message, validate_start
from rtvideo.triton.model_repo import derive_model, read_parameters
from tests.support.processes import RTVIDEO


def omni_settings(**params: str) -> BackendSettings:
    return BackendSettings.from_parameters(
        {"generator": "vllm_omni", "width": "640", "height": "384", "frames_per_chunk": "33", **params}
    )


def test_start_validation_uses_the_active_generators_limits_and_names() -> None:
    caps = omni_settings().capabilities("realtime_video")
    assert caps.model_names == ("realtime_video", "BestWishYsh/Helios-Distilled", "rtvideo-vllm_omni")
    config = resolve_session_config(
        validate_start(
            check_first_message(
                json.dumps({"type": "session.start", "prompt": "p", "model": "BestWishYsh/Helios-Distilled"}).encode()
            )
        ),
        caps,
    )
    assert (config.width, config.height, config.frames_per_chunk, config.model) == (640, 384, 33, "realtime_video")
    with pytest.raises(ProtocolError, match="multiple of 64"):
        resolve_session_config(
            validate_start(check_first_message(b'{"type": "session.start", "prompt": "p", "width": 200}')), caps
        )
    builtin = BackendSettings().capabilities("realtime_video")
    assert resolve_session_config(
        validate_start(check_first_message(b'{"type": "session.start", "prompt": "p", "width": 200}')), builtin
    )


@pytest.mark.parametrize(
    "params,fragment",
    [
        ({"vllm_omni_engine_args": "{oops"}, "not valid JSON"),
        ({"vllm_omni_extra_params": "[1, 2]"}, "must be a JSON object"),
        ({"vllm_omni_health_seconds": "0"}, "positive"),
        ({"vllm_omni_engine": "vllm_omni.AsyncOmni"}, "module:callable"),
        ({"vllm_omni_engine": "engines/standin.py:Engine"}, "module:callable"),  # a module, not a file
        ({"width": "632"}, "multiple of 16"),
    ],
)
def test_bad_vllm_omni_parameters_fail_the_load(params: dict, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        omni_settings(**params)


def test_json_parameters_survive_config_pbtxt(tmp_path) -> None:
    preset = {"is_enable_stage2": True, "quote": 'say "hi"', "path": "C:\\models", "list": [2, 2, 2]}
    derive_model(tmp_path, "m", {"generator": "vllm_omni", "vllm_omni_extra_params": json.dumps(preset)})
    params = read_parameters(tmp_path / "m")
    assert json.loads(params["vllm_omni_extra_params"]) == preset
    assert BackendSettings.from_parameters(params).extra_params() == preset


def test_serve_takes_the_vllm_omni_flags_and_refuses_bad_ones() -> None:
    help_text = subprocess.run([str(RTVIDEO), "serve", "--help"], capture_output=True, text=True, timeout=60).stdout
    for flag in ("--generator", "--vllm-omni-model", "--vllm-omni-engine-args", "--vllm-omni-extra-params"):
        assert flag in help_text
    out = subprocess.run(
        [str(RTVIDEO), "serve", "--generator", "vllm_omni", "--vllm-omni-extra-params", "[]"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "must be a JSON object" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize(
    "make",
    [
        lambda v: v,  # uint8 [T, H, W, 3]
        lambda v: v.astype(np.float32) / 255,  # floats in [0, 1]
        lambda v: torch.from_numpy(v.astype(np.float32) / 127.5 - 1),  # torch floats in [-1, 1]
        lambda v: torch.from_numpy(v).permute(0, 3, 1, 2).contiguous(),  # channels first
        lambda v: [frame for frame in v],  # a list of frames
        lambda v: v[None],  # a batch of one
    ],
)
def test_rgb_frames_reads_what_the_engine_outputs(make) -> None:
    video = np.random.default_rng(0).integers(0, 256, (3, 16, 32, 3), dtype=np.uint8)
    frames = rgb_frames(make(video))
    assert frames.dtype == np.uint8 and frames.shape == (3, 16, 32, 3) and frames.flags.c_contiguous
    assert np.abs(frames.astype(int) - video).max() <= 1


def test_rgb_frames_refuses_a_batch_and_missing_metadata_is_empty() -> None:
    with pytest.raises(EngineError):
        rgb_frames(np.zeros((2, 3, 16, 16, 3), np.uint8))
    assert stream_metadata(object()) == {}


# scripts/check_vllm_image.py (the image check): tests/deploy/test_vllm_lock.py
