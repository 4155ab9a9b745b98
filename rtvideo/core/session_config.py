"""Resolve a `session.start` against the model's defaults and capabilities (pure)."""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from typing import Any

from rtvideo.core.errors import ErrorCode, ProtocolError
from rtvideo.core.protocol import MAX_SEED, StartRequest


@dataclass(frozen=True)
class ModelCapabilities:
    """What the served model produces and accepts; values outside are rejected, never ignored."""

    model_names: tuple[str, ...]
    width: int
    height: int
    fps: int
    frames_per_chunk: int
    default_transition_chunks: int
    min_dimension: int = 32
    max_dimension: int = 1280
    max_fps: int = 60
    #: start fields the generator cannot honour at all (rejected when given)
    unsupported_fields: tuple[str, ...] = ("negative_prompt", "num_inference_steps", "guidance_scale")


@dataclass(frozen=True)
class SessionConfig:
    """The accepted start request with every default resolved (sent in `video.start`)."""

    prompt: str
    format: str
    model: str
    width: int
    height: int
    fps: int
    frames_per_chunk: int
    default_transition_chunks: int
    num_frames: int | None
    seed: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def resolve_session_config(
    start: StartRequest, caps: ModelCapabilities, rng: random.Random | None = None
) -> SessionConfig:
    """Apply defaults, then reject what this model cannot produce with a sentence saying why."""
    if start.model is not None and start.model not in caps.model_names:
        raise ProtocolError(
            ErrorCode.MODEL_MISMATCH,
            f"model {start.model!r} is not served here; this endpoint serves {caps.model_names[0]!r}",
        )
    given = [name for name in caps.unsupported_fields if getattr(start, name) is not None]
    if start.extra_params:
        given.append("extra_params (" + ", ".join(sorted(start.extra_params)) + ")")
    if given:
        raise ProtocolError(
            ErrorCode.INVALID_START, f"{', '.join(given)} not supported by model {caps.model_names[0]!r}"
        )
    width = start.width if start.width is not None else caps.width
    height = start.height if start.height is not None else caps.height
    for name, value in (("width", width), ("height", height)):
        if value % 2 or not caps.min_dimension <= value <= caps.max_dimension:
            raise ProtocolError(
                ErrorCode.INVALID_START,
                f"{name} {value} is not supported: use an even number from "
                f"{caps.min_dimension} to {caps.max_dimension}",
            )
    fps = start.fps if start.fps is not None else caps.fps
    if fps > caps.max_fps:
        raise ProtocolError(ErrorCode.INVALID_START, f"fps {fps} is not supported: the maximum is {caps.max_fps}")
    num_frames = start.num_frames
    if num_frames is None and start.seconds is not None:
        num_frames = max(1, round(start.seconds * fps))
    seed = start.seed if start.seed is not None else (rng or random.Random()).randint(0, MAX_SEED)
    return SessionConfig(
        prompt=start.prompt,
        format=start.format,
        model=caps.model_names[0],
        width=width,
        height=height,
        fps=fps,
        frames_per_chunk=caps.frames_per_chunk,
        default_transition_chunks=caps.default_transition_chunks,
        num_frames=num_frames,
        seed=seed,
    )
