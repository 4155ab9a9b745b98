"""The load-time check of a vLLM-Omni deployment against its GPU's memory.

A deployment whose weights and sessions cannot fit the device would load for minutes and then
fail inside the engine (an out-of-memory error in the worker, or a KV pool that admits nothing).
`check` refuses it first, at model load, with the numbers: what the model's rules
(`model_rules.ModelRules.reserved_bytes`: weights, less online FP8's saving, plus each session at
its peak) reserve against what the device has (`torch.cuda.get_device_properties(...).total_memory`).

The device's size is a seam (`device_bytes`): the Triton model passes what torch reports, a test
passes a stated size (an H100's 80 GB) on a CPU. Without CUDA (the real engine's CPU test, a
stand-in) there is no device to check and nothing is refused.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from rtvideo.backend.vllm_omni import interaction_rules
from rtvideo.backend.vllm_omni.model_rules import ModelRules

log = logging.getLogger(__name__)

#: the engine argument (or deploy config stage key) that turns online quantization on, and its
#: canonical name (vLLM-Omni's `diffusion/data.py` moves `quantization` to `quantization_config`)
QUANTIZATION_KEYS = ("quantization", "quantization_config")


def device_total_bytes(device: str = "cuda") -> int | None:
    """Total memory of the GPU the engine runs on (`cuda`, `cuda:N`; else the first), or None
    without torch or CUDA. The engine imports torch anyway; this runs just before it starts."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    index = int(device.split(":", 1)[1]) if device.startswith("cuda:") else 0
    return int(torch.cuda.get_device_properties(index).total_memory)


def fp8_enabled(engine_args: Mapping[str, Any]) -> bool:
    """Whether the deployment quantizes online to FP8: `quantization` (or `quantization_config`)
    in the engine arguments, else in the deploy config's stage, naming `fp8` (a string, or a
    per-component mapping whose `transformer` is `fp8`)."""
    deploy = engine_args.get("deploy_config")
    for key in QUANTIZATION_KEYS:
        for value in (engine_args.get(key), interaction_rules.deploy_stage_value(deploy, key)):
            if value is None:
                continue
            if isinstance(value, str):
                return value.strip().lower() == "fp8"
            if isinstance(value, Mapping):
                method = value.get("method", value.get("transformer"))
                if isinstance(method, Mapping):
                    method = method.get("method")
                return isinstance(method, str) and method.strip().lower() == "fp8"
    return False


def check(
    rules: ModelRules | None,
    engine_args: Mapping[str, Any],
    size: tuple[int, int],
    frames: int,
    sessions: int,
    device_bytes: int | None,
) -> None:
    """Refuse (ValueError, with the numbers) a deployment whose reserved memory exceeds the device;
    log what it reserves otherwise. Nothing to check without rules or without a device."""
    if rules is None or device_bytes is None or not rules.weights_bytes:
        return
    width, height = size
    frames = rules.frame_cap(width, height, frames)
    fp8 = fp8_enabled(engine_args)
    problem = rules.load_memory_problem(device_bytes, width, height, frames, sessions, fp8)
    if problem is not None:
        raise ValueError(f"model load refused: {problem}")
    log.info(
        "GPU memory: %s reserves %.1f GB before activations (%s, %d session(s) of %d frames at %dx%d) "
        "of the device's %.1f GB",
        rules.name,
        rules.reserved_bytes(width, height, frames, sessions, fp8) / 1e9,
        "FP8" if fp8 else "bf16",
        sessions,
        frames,
        width,
        height,
        device_bytes / 1e9,
    )
