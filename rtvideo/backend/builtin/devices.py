"""Which device a model instance's generator runs on (no torch import: unit-tested without a GPU).

Triton creates one model instance per `count` per GPU of a `KIND_GPU` instance group and tells
each its kind and GPU (`args["model_instance_kind"] == "GPU"`, `args["model_instance_device_id"]`).
Such an instance's generator runs on that GPU, `cuda:<id>`, unless the `device` parameter names
a device itself (`cpu`, `cuda:N`). Each instance has its own session manager, so `max_sessions`
is per instance.
"""

from __future__ import annotations

from collections.abc import Mapping


def instance_device(device: str, instance_kind: str | None, device_id: str | int | None) -> str:
    """The device setting for one model instance: `device` as given, except that `auto` or a bare
    `cuda` on a GPU instance becomes `cuda:<its GPU>`."""
    if instance_kind != "GPU" or device not in ("auto", "cuda") or device_id in (None, ""):
        return device
    index = int(device_id)
    if index < 0:
        raise ValueError(f"model_instance_device_id {device_id!r} is not a GPU index")
    return f"cuda:{index}"


def device_from_args(device: str, args: Mapping[str, str]) -> str:
    """`instance_device` with what Triton passes `TritonPythonModel.initialize`."""
    return instance_device(device, args.get("model_instance_kind"), args.get("model_instance_device_id"))
