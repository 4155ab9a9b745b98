"""Resolve a `session.start` against the model's defaults and capabilities (pure)."""

from __future__ import annotations

import copy
import numbers
import random
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from rtvideo.core import codec_options as codec
from rtvideo.core.codec_options import EncoderOptions
from rtvideo.core.conditioning import LINEAR
from rtvideo.core.errors import ErrorCode, ProtocolError
from rtvideo.core.interaction.refusal import PipelineInteractions
from rtvideo.core.interaction.support import InteractionSupport
from rtvideo.core.interaction.types import PROMPT, resolve_chunks
from rtvideo.core.protocol import MAX_SEED
from rtvideo.core.rebuild import Rebuild
from rtvideo.core.start_request import SAMPLING_FIELDS, StartRequest
from rtvideo.core.streaming_pacing import StreamingPacing


@dataclass(frozen=True)
class GeneratorLimits:
    """What a generator, and the encoder behind it, can produce. One object per generator,
    read by the generator, the encoder, the model's settings check and start validation,
    so the four cannot disagree. Wire limits (what any message may say) stay in `protocol`."""

    min_side: int = 32
    max_side: int = 1280
    max_fps: int = 60

    def size_problem(self, width: int, height: int) -> str | None:
        """Why a frame size cannot be produced (H.264 4:2:0 needs even sides), or None."""
        for name, side in (("width", width), ("height", height)):
            if not isinstance(side, numbers.Integral) or isinstance(side, bool):
                return f"{name} must be an integer, not {side!r}"
            if side % 2 or not self.min_side <= side <= self.max_side:
                return f"{name} {side} is not supported: use an even number from {self.min_side} to {self.max_side}"
        return None

    def fps_problem(self, fps: int) -> str | None:
        """Why a frame rate cannot be produced, or None."""
        if not 1 <= fps <= self.max_fps:
            return f"fps {fps} is not supported: use 1 to {self.max_fps}"
        return None

    def start_problem(self, start: StartRequest) -> str | None:
        """Why a model refuses the rest of `start` (a missing first frame, a step count), or None."""
        return None

    def frame_cap(self, width: int, height: int, cap: int) -> int:
        """The longest session at this size under the generator's length cap `cap`."""
        return cap


@dataclass(frozen=True)
class ModelCapabilities:
    """What the served model produces and accepts. Size and rate outside it are rejected, never
    changed; a length over the generator's cap (`max_num_frames`) is cut to it and reported in
    `config.num_frames`; sampling knobs the generator does not use are accepted and reported as
    ignored, the ones it uses are merged over its preset (docs/protocol.md §2.1)."""

    #: the names a start's `model` may ask for; the first is reported in `video.start`
    model_names: tuple[str, ...]
    width: int
    height: int
    fps: int
    frames_per_chunk: int
    default_transition_chunks: int
    limits: GeneratorLimits = GeneratorLimits()
    #: `start_request.SAMPLING_FIELDS` the generator uses; the others are ignored when given
    sampling_fields: frozenset[str] = frozenset()
    #: `extra_params` keys the generator uses; the others are ignored when given
    extra_params: frozenset[str] = frozenset()
    #: every `extra_params` key is used (passed on to an engine whose model reads what it knows)
    all_extra_params: bool = False
    #: whether the generator paces to the player, so a start's `streaming_buffer_seconds` sets the
    #: session's lead (`SessionConfig.streaming_buffer_seconds`); else it is ignored
    paces: bool = False
    #: `start_request.REQUEST_FIELDS` the generator uses (merged into `sampling`); the others are ignored
    start_fields: frozenset[str] = frozenset()
    #: the session's encoder takes `extra_params.video_codec_options` (`rtvideo.core.codec_options`):
    #: what maps is applied there and not passed on, the rest is ignored; else the key is ignored
    codec_options: bool = False
    #: the model's preset, for a generator that takes sampling (None: it takes none): sampling
    #: fields and `extra_params`, over which a start's own values are merged (`SessionConfig.sampling`)
    sampling_defaults: Mapping[str, Any] | None = None
    #: the longest session in frames (None: no cap); a start without a length gets it, a longer
    #: one is cut to it, and `config.num_frames` says so (docs/protocol.md §2.1)
    max_num_frames: int | None = None
    #: the deployed model's own rules as a client is told them (`config.model_rules`), if it has any
    model_rules: Mapping[str, Any] | None = None
    #: the interactions it takes (`config.interactions`; the catalog's entry for its generator)
    interactions: InteractionSupport | None = None
    #: a hosted engine's model's own rule about interactions (the modalities its pipeline
    #: registers), which `interaction_refusal` applies; None: the built-in generator, or unknown
    pipeline_interactions: PipelineInteractions | None = None

    def ignored_fields(self, start: StartRequest) -> list[str]:
        """What `start` sets that this generator does not use, sorted (`extra_params.KEY` for extras)."""
        used = self.sampling_fields | {f"extra_params.{key}" for key in self.extra_params}
        return sorted(
            [
                name
                for name in start.sampling_given()
                if name not in used and not (self.all_extra_params and name.startswith("extra_params."))
            ]
            + [name for name in start.request_fields if name not in self.start_fields]
            + (codec.ignored(start.extra_params) if self.codec_options else [])
            + ([start.pacing_field] if start.pacing_field is not None and not self.paces else [])
        )

    def sampling(self, start: StartRequest) -> dict[str, Any]:
        """The sampling the generator runs `start` with: the preset, with each sampling field the
        start sets and the generator uses over it, and `extra_params` merged key by key. Empty
        for a generator that takes none."""
        if self.sampling_defaults is None:
            return {}
        merged = copy.deepcopy(dict(self.sampling_defaults))
        extra = dict(merged.pop("extra_params", None) or {})
        for name in SAMPLING_FIELDS:
            value = getattr(start, name)
            if value is not None and name in self.sampling_fields:
                merged[name] = value
        for key, value in start.extra_params.items():
            if self.codec_options and key == codec.VIDEO_CODEC_OPTIONS:
                continue  # our encoder's (`SessionConfig.encoder_options`), not the engine's
            if self.all_extra_params or key in self.extra_params:
                extra[key] = copy.deepcopy(value)
        for name, value in start.request_fields.items():
            if name in self.start_fields:
                merged[name] = copy.deepcopy(value)
        return {**merged, "extra_params": extra}


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
    #: well-formed sampling fields the generator does not use (§2.1), sorted; always sent
    ignored_fields: tuple[str, ...] = ()
    #: what the generator samples with (`ModelCapabilities.sampling`): sent as `config.sampling`
    #: by a generator that takes sampling (vllm_omni), absent for the built-in one
    sampling: Mapping[str, Any] = field(default_factory=dict)
    #: the start's `image_reference`, decoded by the backend (rtvideo/backend/media/image_reference.py):
    #: uint8 RGB [height, width, 3], resized to the session's size, or None. Never sent (not in `to_json`).
    reference_image: Any = field(default=None, repr=False, compare=False)
    #: `ModelCapabilities.model_rules`, sent as `config.model_rules` when the model has rules
    model_rules: Mapping[str, Any] | None = None
    #: the start's `streaming_buffer_seconds` where the generator paces (its lead over the player,
    #: in place of the model's `pacing_lead_chunks`), else None. Not sent (not in `to_json`).
    streaming_buffer_seconds: float | None = None
    #: vLLM-Omni 0.32's `streaming_pacing` (or its alias) where the generator paces and it is
    #: enabled: the session is paced to its client's playhead (rtvideo/core/streaming_pacing.py)
    #: and its chunks carry `output_chunk_index` and `pacing`. Sent resolved when set.
    streaming_pacing: StreamingPacing | None = None
    #: a blend start's `prompts`, normalised (then `prompt` is its heaviest text); sent when set
    prompts: tuple[tuple[str, float], ...] | None = None
    #: the session's default interpolation (an interaction without one uses it); always sent
    interpolation: str = LINEAR
    #: `ModelCapabilities.interactions`, sent as `config.interactions` when known
    interactions: InteractionSupport | None = None
    #: `ModelCapabilities.pipeline_interactions`. Never sent (not in `to_json`)
    pipeline_interactions: PipelineInteractions | None = None
    #: the start asked for in-band timing (`timing` on each media chunk); sent as `config.metrics`
    #: only when true, so a client that did not ask sees nothing new
    metrics: bool = False
    #: the start's model-internal `rebuild` (`rtvideo.core.rebuild`), or None. Never sent (not in `to_json`)
    rebuild: Rebuild | None = field(default=None, repr=False, compare=False)
    #: the start's `extra_params.video_codec_options` as the session's encoder takes them
    #: (`ModelCapabilities.codec_options`); never sent (what was not taken is in `ignored_fields`)
    encoder_options: EncoderOptions = field(default_factory=EncoderOptions)

    def transition_chunks(self, requested: int | None) -> int:
        """A prompt's N (docs/protocol.md §5): its own `transition_chunks`, else this
        session's default (`interaction.resolve_chunks`, where every kind's default is applied)."""
        return resolve_chunks(PROMPT, requested, self.default_transition_chunks)

    def to_json(self) -> dict[str, Any]:
        out = asdict(replace(self, reference_image=None, rebuild=None))
        out.pop("reference_image")
        out.pop("rebuild")
        out.pop("encoder_options")
        out["ignored_fields"] = list(self.ignored_fields)
        out.pop("sampling")
        if self.sampling:
            out["sampling"] = copy.deepcopy(dict(self.sampling))
        if out.pop("model_rules") is not None:
            out["model_rules"] = copy.deepcopy(dict(self.model_rules or {}))
        if not out["metrics"]:
            del out["metrics"]
        out.pop("prompts")
        if self.prompts is not None:
            out["prompts"] = [{"text": text, "weight": weight} for text, weight in self.prompts]
        out.pop("streaming_pacing")
        if self.streaming_pacing is not None:
            out["streaming_pacing"] = self.streaming_pacing.to_json()
        out.pop("pipeline_interactions")
        out.pop("interactions")
        if self.interactions is not None:
            out["interactions"] = self.interactions.describe()
        return out


def resolve_session_config(
    start: StartRequest, caps: ModelCapabilities, rng: random.Random | None = None
) -> SessionConfig:
    """Apply defaults, then reject what this model cannot produce with a sentence saying why."""
    if start.model is not None and start.model not in caps.model_names:
        served = ", ".join(repr(name) for name in caps.model_names)
        raise ProtocolError(
            ErrorCode.MODEL_MISMATCH, f"model {start.model!r} is not served here; this endpoint serves {served}"
        )
    width = start.width if start.width is not None else caps.width
    height = start.height if start.height is not None else caps.height
    fps = start.fps if start.fps is not None else caps.fps
    problem = (
        caps.limits.size_problem(width, height) or caps.limits.fps_problem(fps) or caps.limits.start_problem(start)
    )
    if problem is None and caps.interactions is not None:
        problem = caps.interactions.start_problem(blend=start.prompts is not None, interpolation=start.interpolation)
    if problem is None and caps.codec_options:
        problem = codec.problem(start.extra_params)
    if problem is None and caps.paces and start.streaming_buffer_seconds is not None:
        chunk_seconds = caps.frames_per_chunk / fps
        if start.streaming_buffer_seconds < chunk_seconds:  # 0.32: "must fit a complete media chunk"
            problem = (
                f"{start.pacing_field}'s lead ({start.streaming_buffer_seconds:g} s) must fit one chunk "
                f"({chunk_seconds:g} s here)"
            )
    if problem:
        raise ProtocolError(ErrorCode.INVALID_START, problem)
    num_frames = start.num_frames
    if num_frames is None and start.seconds is not None:
        num_frames = max(1, round(start.seconds * fps))
    if caps.max_num_frames is not None:  # the generator's length cap (a bounded engine request)
        cap = caps.limits.frame_cap(width, height, caps.max_num_frames)
        num_frames = cap if num_frames is None else min(num_frames, cap)
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
        ignored_fields=tuple(caps.ignored_fields(start)),
        sampling=caps.sampling(start),
        model_rules=caps.model_rules,
        streaming_buffer_seconds=start.streaming_buffer_seconds if caps.paces else None,
        streaming_pacing=start.streaming_pacing if caps.paces and start.streaming_buffer_seconds is not None else None,
        metrics=start.metrics,
        encoder_options=codec.encoder_options(start.extra_params) if caps.codec_options else EncoderOptions(),
        prompts=start.prompts,
        interpolation=start.interpolation or (caps.interactions.interpolation[0] if caps.interactions else LINEAR),
        interactions=caps.interactions,
        pipeline_interactions=caps.pipeline_interactions,
    )
