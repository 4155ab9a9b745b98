"""A start's `extra_params.video_codec_options`, read for OUR encoder (pure: no I/O).

vLLM-Omni 0.30's streaming endpoint hands `extra_params["video_codec_options"]` to its own fMP4
encoder as libx264 options (`serving_video_output_stream.py`: `create_streaming_video_encoder(...,
video_codec_options=...)`, default `{"preset": "ultrafast", "threads": "0", "tune": "zerolatency"}`,
over `crf` 18). The engine's pipelines read nothing of it. Here the session's own encoder
(`rtvideo/backend/media/encoder.py`) takes what maps onto it, and the engine is not sent it:

- `crf` (0 to 51): x264's constant rate factor (ours is x264's default, 23, when not given);
- `preset` (x264's, `ultrafast` to `veryslow`): speed against size (ours: `ultrafast`);
- `g`, also spelled `keyint`: the keyframe interval in frames. Every chunk already starts on a
  keyframe (a fragment decodes on its own); a smaller interval adds keyframes inside a chunk;
- `tune`: only `zerolatency`, which ours always uses (one packet out per frame in: a chunk goes
  out the moment its frames are encoded); another tune is refused.

Any other key (`threads`, `profile`, `x264-params`...) is accepted and listed in
`config.ignored_fields` as `extra_params.video_codec_options.KEY`: ours keeps one thread per
session (many sessions share the CPU) and the baseline profile every MSE browser plays.
A value out of range, or `video_codec_options` not an object, refuses the start (`invalid_start`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: the `extra_params` key vLLM-Omni's endpoint reads
VIDEO_CODEC_OPTIONS = "video_codec_options"
#: x264's presets, fastest first (`placebo` left out: never a real-time setting)
X264_PRESETS = ("ultrafast", "superfast", "veryfast", "faster", "fast", "medium", "slow", "slower", "veryslow")
#: x264's CRF range for 8-bit video
CRF_RANGE = (0, 51)
#: the longest keyframe interval taken (x264 accepts more; a chunk starts on a keyframe anyway)
MAX_KEYFRAME_INTERVAL = 100_000
#: the only tune our encoder runs (it needs one packet out per frame in)
TUNE = "zerolatency"
#: the keys that map onto our encoder
MAPPED = frozenset({"crf", "preset", "g", "keyint", "tune"})


@dataclass(frozen=True)
class EncoderOptions:
    """What a start asks of the session's encoder; None: the encoder's own default."""

    crf: float | None = None
    preset: str | None = None
    keyframe_interval: int | None = None

    def __bool__(self) -> bool:
        return any(value is not None for value in (self.crf, self.preset, self.keyframe_interval))


def _options(extra_params: Mapping[str, Any]) -> Mapping[str, Any] | None:
    value = extra_params.get(VIDEO_CODEC_OPTIONS)
    return value if isinstance(value, Mapping) else None


def _number(value: Any) -> float | None:
    """An option value as vLLM-Omni passes it (PyAV takes strings): a number or a numeric string."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            return None
    return None


def problem(extra_params: Mapping[str, Any]) -> str | None:
    """Why the start's `video_codec_options` cannot be applied (None when it can, or is absent)."""
    if VIDEO_CODEC_OPTIONS not in extra_params:
        return None
    options = _options(extra_params)
    if options is None:
        return f"extra_params.{VIDEO_CODEC_OPTIONS} must be an object of encoder option names to values"
    where = f"extra_params.{VIDEO_CODEC_OPTIONS}"
    problems = [_crf_problem(where, options), _preset_problem(where, options), _keyframe_problem(where, options)]
    if "tune" in options and str(options["tune"]).strip().lower() != TUNE:
        problems.append(
            f"{where}.tune {options['tune']!r} is not supported: this server's encoder runs {TUNE!r} "
            "(each chunk is sent as soon as its frames are encoded)"
        )
    return next((found for found in problems if found is not None), None)


def _crf_problem(where: str, options: Mapping[str, Any]) -> str | None:
    if "crf" not in options:
        return None
    crf = _number(options["crf"])
    low, high = CRF_RANGE
    if crf is None or not low <= crf <= high:
        return f"{where}.crf must be a number from {low} to {high}, not {options['crf']!r}"
    return None


def _preset_problem(where: str, options: Mapping[str, Any]) -> str | None:
    if "preset" in options and str(options["preset"]).strip().lower() not in X264_PRESETS:
        return f"{where}.preset must be one of {list(X264_PRESETS)}, not {options['preset']!r}"
    return None


def _keyframe_problem(where: str, options: Mapping[str, Any]) -> str | None:
    for key in ("g", "keyint"):
        if key in options:
            interval = _number(options[key])
            if interval is None or interval != int(interval) or not 1 <= interval <= MAX_KEYFRAME_INTERVAL:
                return (
                    f"{where}.{key} (the keyframe interval) must be a whole number of frames from 1 to "
                    f"{MAX_KEYFRAME_INTERVAL}, not {options[key]!r}"
                )
    if "g" in options and "keyint" in options and _number(options["g"]) != _number(options["keyint"]):
        return f"{where}: g and keyint are both the keyframe interval; give one"
    return None


def encoder_options(extra_params: Mapping[str, Any]) -> EncoderOptions:
    """The options that map onto our encoder (call after `problem` found none)."""
    options = _options(extra_params) or {}
    crf = _number(options["crf"]) if "crf" in options else None
    preset = str(options["preset"]).strip().lower() if "preset" in options else None
    interval = options.get("g", options.get("keyint"))
    keyframes = _number(interval) if interval is not None else None
    return EncoderOptions(crf, preset, int(keyframes) if keyframes is not None else None)


def ignored(extra_params: Mapping[str, Any]) -> list[str]:
    """The start's codec options our encoder does not take, as `config.ignored_fields` names them."""
    options = _options(extra_params) or {}
    return [f"extra_params.{VIDEO_CODEC_OPTIONS}.{key}" for key in options if key not in MAPPED]
