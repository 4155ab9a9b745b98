"""What an engine output carries: its per-chunk stream metadata and its decoded frames as uint8 RGB."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from rtvideo.backend.vllm_omni.engine import EngineError


def stream_metadata(output: Any) -> Mapping[str, Any]:
    """The chunk's event ids: `multimodal_output["metadata"]["stream"]` (empty when absent)."""
    multimodal = getattr(output, "multimodal_output", None)
    metadata = multimodal.get("metadata") if isinstance(multimodal, Mapping) else None
    stream = metadata.get("stream") if isinstance(metadata, Mapping) else None
    return stream if isinstance(stream, Mapping) else {}


def output_video(output: Any) -> Any:
    """The chunk's frames: `images`, else `multimodal_output["video"]`."""
    images = getattr(output, "images", None)
    if images:
        return images
    multimodal = getattr(output, "multimodal_output", None)
    video = multimodal.get("video") if isinstance(multimodal, Mapping) else None
    if video is None:
        raise EngineError("the engine output carries no video frames")
    return video


def rgb_frames(video: Any) -> np.ndarray:
    """Decoded frames as contiguous uint8 [T, H, W, 3] RGB.

    Accepts what vLLM-Omni outputs: a torch tensor or numpy array [T, H, W, C] or
    [T, C, H, W] (or a batch of one), or a list of frames (PIL images, arrays, tensors).
    Floats are taken as [0, 1], or as [-1, 1] when they leave that range (torch floats:
    always [-1, 1], as vLLM-Omni's own encoder reads them).
    """
    torch_float = False
    if isinstance(video, (list, tuple)):
        if len(video) == 1 and getattr(video[0], "ndim", 0) >= 4:
            return rgb_frames(video[0])
        arrays = [_array(frame) for frame in video]
        torch_float = any(_is_torch_float(frame) for frame in video)
        video = np.stack(arrays) if arrays else np.zeros((0, 0, 0, 3), np.uint8)
    else:
        torch_float = _is_torch_float(video)
        video = _array(video)
    if video.ndim == 5:
        if video.shape[0] != 1:
            raise EngineError(f"expected one video, got a batch of {video.shape[0]}")
        video = video[0]
    if video.ndim != 4:
        raise EngineError(f"expected frames [T, H, W, C], got shape {video.shape}")
    if video.shape[-1] not in (3, 4) and video.shape[1] in (3, 4):
        video = video.transpose(0, 2, 3, 1)
    video = video[..., :3]
    if video.dtype != np.uint8:
        data = video.astype(np.float32)
        if np.issubdtype(video.dtype, np.integer):
            data = data / 255.0
        elif torch_float or (data.size and (data.min() < 0.0 or data.max() > 1.0)):
            data = np.clip(data, -1.0, 1.0) * 0.5 + 0.5
        video = (np.clip(data, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)
    return np.ascontiguousarray(video)


def _is_torch_float(value: Any) -> bool:
    return type(value).__module__.startswith("torch") and bool(getattr(value, "is_floating_point", lambda: False)())


def _array(value: Any) -> np.ndarray:
    if type(value).__module__.startswith("torch"):
        return value.detach().float().cpu().numpy() if value.is_floating_point() else value.detach().cpu().numpy()
    return np.asarray(value)
