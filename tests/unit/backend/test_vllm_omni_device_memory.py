"""The load-time check of a vLLM-Omni deployment against its GPU's memory
(`rtvideo/backend/vllm_omni/device_memory.py`), on a CPU through its stated device size, and the
one-H100 LingBot-World deploy config with online FP8 against the pinned wheel.
"""

from __future__ import annotations

import json

import pytest
import yaml

from rtvideo.backend.loading.settings import BackendSettings
from rtvideo.backend.vllm_omni import device_memory, interaction_rules
from rtvideo.backend.vllm_omni.model_rules import HELIOS_DISTILLED, LINGBOT_WORLD
from tests.support.paths import REPO_ROOT
from tests.support.vllm_omni_wheel import wheel_source

#: what torch reports for an H100 80GB (`get_device_properties(0).total_memory`): 79.2 GiB
H100_BYTES = 85_031_714_816
#: an A100 40GB / L40S-sized device
SMALL_BYTES = 47_697_362_944
H100_FP8 = REPO_ROOT / "deploy/gpu/lingbot_world_h100_fp8.yaml"
H200 = REPO_ROOT / "deploy/gpu/lingbot_world_stepwise.yaml"


def _lingbot(deploy: str) -> dict:
    return {"deploy_config": deploy}


def test_lingbot_bf16_fits_an_h100_before_activations_and_fp8_saves_the_dits_bytes() -> None:
    bf16 = LINGBOT_WORLD.reserved_bytes(832, 480, 1449, 1, fp8=False)
    fp8 = LINGBOT_WORLD.reserved_bytes(832, 480, 1449, 1, fp8=True)
    assert 74e9 < bf16 < 76e9 and 60e9 < fp8 < 62e9 and bf16 - fp8 == LINGBOT_WORLD.fp8_saving_bytes
    # the length does not matter to LingBot (a fixed window); it does to Helios (its history)
    assert LINGBOT_WORLD.reserved_bytes(832, 480, 9, 1, False) == bf16
    assert HELIOS_DISTILLED.reserved_bytes(640, 384, 66, 1, False) < HELIOS_DISTILLED.reserved_bytes(
        640, 384, 1452, 1, False
    )
    for deploy in (H200, H100_FP8):
        device_memory.check(LINGBOT_WORLD, _lingbot(str(deploy)), (832, 480), 1452, 1, H100_BYTES)


def test_a_deployment_over_the_device_is_refused_with_the_numbers() -> None:
    with pytest.raises(ValueError) as caught:
        device_memory.check(LINGBOT_WORLD, _lingbot(str(H200)), (832, 480), 1452, 1, SMALL_BYTES)
    words = str(caught.value)
    assert words.startswith("model load refused: LingBot-World needs 74.6 GB of GPU memory before activations")
    assert "over the device's 47.7 GB" in words and "weights 39.7 GB + 1 session(s) x 34.9 GB" in words
    assert "Use quantization: fp8 (deploy/gpu/lingbot_world_h100_fp8.yaml)" in words
    # FP8 alone does not fit it either: refused, and FP8 is not offered again
    with pytest.raises(ValueError) as caught:
        device_memory.check(LINGBOT_WORLD, _lingbot(str(H100_FP8)), (832, 480), 1452, 1, SMALL_BYTES)
    assert "weights 25.7 GB (FP8)" in str(caught.value) and "Use quantization" not in str(caught.value)
    # Helios' sessions each hold their history: on 64 GB two at the cap fit, four do not, and
    # four sessions of 330 frames (a lower vllm_omni_max_request_frames) do
    device_memory.check(HELIOS_DISTILLED, {}, (640, 384), 1452, 2, 64 * 10**9)
    with pytest.raises(ValueError, match=r"4 session\(s\) x 8.6 GB \(1452 frames of decoded history at 640x384"):
        device_memory.check(HELIOS_DISTILLED, {}, (640, 384), 1452, 4, 64 * 10**9)
    device_memory.check(HELIOS_DISTILLED, {}, (640, 384), 330, 4, 64 * 10**9)


def test_nothing_is_checked_without_a_device_or_rules() -> None:
    device_memory.check(LINGBOT_WORLD, _lingbot(str(H200)), (832, 480), 1452, 8, None)
    device_memory.check(None, {}, (640, 384), 1452, 8, 1)
    assert device_memory.device_total_bytes() is None  # this CPU has no CUDA device


def test_fp8_is_read_from_the_engine_args_or_the_deploy_configs_stage() -> None:
    assert device_memory.fp8_enabled(_lingbot(str(H100_FP8)))
    assert not device_memory.fp8_enabled(_lingbot(str(H200)))
    assert device_memory.fp8_enabled({"quantization": "fp8"})
    assert device_memory.fp8_enabled({"quantization_config": {"transformer": {"method": "fp8"}, "vae": None}})
    assert not device_memory.fp8_enabled({"quantization": "int8"})


def test_the_h100_config_is_the_shipped_one_with_the_wheels_online_fp8() -> None:
    """The one-H100 config differs from the H200 one (the wheel's, checked in the rules test)
    by `quantization: fp8` alone; the wheel moves that stage key to `quantization_config`,
    builds it with `build_quant_config`, and LingBot-World hands it to its transformer."""
    ours, h200 = yaml.safe_load(H100_FP8.read_text()), yaml.safe_load(H200.read_text())
    (stage,), (base,) = ours["stages"], h200["stages"]
    assert stage.pop("quantization") == "fp8"
    assert stage == base and {k: v for k, v in ours.items() if k != "stages"} == {
        k: v for k, v in h200.items() if k != "stages"
    }
    data = wheel_source("vllm_omni/diffusion/data.py")
    assert '("quantization", "quantization_config"),' in data
    assert "self.quantization_config = build_quant_config(self.quantization_config)" in data
    assert 'config = build_quant_config("fp8")' in wheel_source("vllm_omni/quantization/__init__.py")
    assert interaction_rules.deploy_config_class(str(H100_FP8)) in LINGBOT_WORLD.pipeline_classes
    assert "lingbot_world_h100_fp8.yaml" in (REPO_ROOT / "Dockerfile").read_text()  # in the GPU image


def test_the_settings_of_a_lingbot_h100_deployment_load() -> None:
    settings = BackendSettings.from_parameters(
        {
            "generator": "vllm_omni",
            "vllm_omni_model": "/models/lingbot",
            "vllm_omni_engine_args": json.dumps({"deploy_config": str(H100_FP8)}),
            "width": "832",
            "height": "480",
            "fps": "5",
        }
    )
    assert settings.model_rules() is not None and settings.model_rules().name == "LingBot-World"  # type: ignore[union-attr]
    device_memory.check(
        settings.model_rules(), settings.engine_args(), (832, 480), settings.vllm_omni_max_request_frames, 1, H100_BYTES
    )
