"""`session.start`: its fields, their kinds and ranges, and its validation (docs/protocol.md §2.1).

Apart from the envelope (`rtvideo.core.protocol`) because a start is the one message with a
schema of its own: vLLM-Omni's `VideoGenerationRequest`, which the model, the proxy and the
session config all read. Pure, like the envelope: every failure is a `ProtocolError`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rtvideo.core.conditioning import INTERPOLATIONS, normalise
from rtvideo.core.errors import ErrorCode, ProtocolError
from rtvideo.core.fields import (
    MAX_PROMPT_CHARS,
    as_int,
    json_kind,
    require_interpolation,
    require_prompt,
    require_prompts,
)
from rtvideo.core.protocol import (
    FORMAT_M4S,
    MAX_DIMENSION,
    MAX_FPS,
    MAX_NUM_FRAMES,
    MAX_SEED,
    MAX_START_BYTES,
    START,
    decode_object,
)
from rtvideo.core.streaming_pacing import STREAMING_PACING, StreamingPacing, from_buffer_seconds, parse_streaming_pacing

MAX_INFERENCE_STEPS = 10_000
#: vLLM-Omni's newer clients' pacing ask: how far generation may run ahead of the reported
#: playhead, in seconds (docs/protocol.md §2.1); a minute is far beyond any real-time buffer
STREAMING_BUFFER = "streaming_buffer_seconds"
MIN_STREAMING_BUFFER_SECONDS, MAX_STREAMING_BUFFER_SECONDS = 0.01, 60.0
MAX_GUIDANCE = 1e6

# Optional `session.start` fields (vLLM-Omni's VideoGenerationRequest) and their kinds.
# docs/protocol.md §2.1 lists each with its range; rtvideo/schemas/client_messages.json says the same.
_START_INT_FIELDS: dict[str, tuple[int, int]] = {
    "width": (1, MAX_DIMENSION),
    "height": (1, MAX_DIMENSION),
    "fps": (1, MAX_FPS),
    "num_frames": (1, MAX_NUM_FRAMES),
    "seed": (0, MAX_SEED),
    "num_inference_steps": (1, MAX_INFERENCE_STEPS),
}
_START_NUMBER_FIELDS: dict[str, tuple[float, float]] = {
    "seconds": (0.0, MAX_NUM_FRAMES),
    "guidance_scale": (0.0, MAX_GUIDANCE),
    "guidance_scale_2": (0.0, MAX_GUIDANCE),
    "true_cfg_scale": (0.0, MAX_GUIDANCE),
    "boundary_ratio": (0.0, 1.0),
    "flow_shift": (0.0, MAX_GUIDANCE),
    STREAMING_BUFFER: (MIN_STREAMING_BUFFER_SECONDS, MAX_STREAMING_BUFFER_SECONDS),
}
_START_STR_FIELDS = ("model", "negative_prompt", "size", "format", "prompt")
_START_OBJECT_FIELDS = ("extra_params", "sampling_params")
#: Bounds of a start's free-form objects (`extra_params`, `sampling_params`, `lora`,
#: `video_params`, the references), each checked alone: what one is costs every reader of the
#: start (the model, `video.start`'s `ignored_fields` and `sampling`, a recording's manifest).
#: Entries count every key and array item at any depth. A legitimate first frame travels in
#: `image_reference`, which these do not bound (the start's own limit does).
MAX_OBJECT_ENTRIES = 256
MAX_OBJECT_DEPTH = 8
#: the JSON size of one such object (references excepted: they may carry a data URL)
MAX_OBJECT_BYTES = 64 * 1024
#: fields of one start, named or not: every named one and the proxy's own options fit many times
MAX_START_FIELDS = 64
#: characters of one field's name (a field name is the client's to choose: an unknown one is echoed
#: in `config.ignored_fields` and in errors)
MAX_FIELD_NAME_CHARS = 128
#: The rest of vLLM-Omni 0.30's `VideoGenerationRequest` (`entrypoints/openai/protocol/videos.py`):
#: accepted when well-formed (its types and ranges), kept in `StartRequest.request_fields`, and
#: reported in `config.ignored_fields` unless the generator uses them (`ModelCapabilities.start_fields`;
#: the `vllm_omni` generator passes `lora` on). tests/unit/core/test_start_fields.py reads the
#: model's fields from the pinned wheel: a field added there fails that test, not a client.
#: Each is (kind, low, high): "string" (at most MAX_PROMPT_CHARS), "quality" (QUALITY_LEVELS),
#: "int" and "number" in [low, high], "positive" in (low, high], "boolean", "object", and
#: "references" (an object or an array of objects).
REQUEST_FIELDS: dict[str, tuple[str, float, float]] = {
    "user": ("string", 0, 0),
    "aspect_ratio": ("string", 0, 0),
    "frame_interpolation_model_path": ("string", 0, 0),
    "quality": ("quality", 0, 0),
    "short_edge": ("int", 1, MAX_SEED),
    "num_outputs_per_prompt": ("int", 1, 10),
    "frame_interpolation_exp": ("int", 1, MAX_SEED),
    "start_time_seconds": ("number", 0.0, MAX_NUM_FRAMES),
    "sound_duration": ("positive", 0.0, MAX_NUM_FRAMES),
    "frame_interpolation_scale": ("positive", 0.0, MAX_GUIDANCE),
    "generate_sound": ("boolean", 0, 0),
    "enable_frame_interpolation": ("boolean", 0, 0),
    "return_stage_metrics": ("boolean", 0, 0),
    "lora": ("object", 0, 0),
    "video_params": ("object", 0, 0),
    "video_reference": ("references", 0, 0),
    "audio_reference": ("references", 0, 0),
}
#: vLLM-Omni's `DIFFUSION_QUALITY_LEVELS`
QUALITY_LEVELS = ("lossless", "high")
#: the first frame's image (vLLM-Omni's `image_reference`): `{"image_url": URL}` or the URL itself;
#: only its shape is checked here, the backend decodes or fetches it (rtvideo/backend/media/image_reference.py)
IMAGE_REFERENCE = "image_reference"
#: `"metrics": true` asks for in-band timing: each media chunk's metadata carries `timing`
#: (the model), and the proxy sends `session.metrics` (docs/protocol.md §3, "session.metrics")
METRICS = "metrics"
#: a weighted prompt blend in place of `prompt`, and the session's default interpolation
#: (docs/protocol.md §2.1); beyond vLLM-Omni's request
BLEND_FIELDS = ("prompts", "interpolation")
START_FIELDS = frozenset(
    {
        "type",
        *BLEND_FIELDS,
        *_START_INT_FIELDS,
        *_START_NUMBER_FIELDS,
        *_START_STR_FIELDS,
        *_START_OBJECT_FIELDS,
        *REQUEST_FIELDS,
        IMAGE_REFERENCE,
        METRICS,
        STREAMING_PACING,
    }
)
#: Diffusion sampling fields of a start: each generator uses some of them
#: (`ModelCapabilities.sampling_fields`); the others are accepted when well-formed and
#: reported in `video.start` `config.ignored_fields`. `extra_params` keys work alike.
SAMPLING_FIELDS: tuple[str, ...] = (
    "negative_prompt",
    "num_inference_steps",
    "guidance_scale",
    "guidance_scale_2",
    "boundary_ratio",
    "flow_shift",
    "true_cfg_scale",
)
#: vLLM-Omni's VideoGenerationRequest takes `seconds` as a string of digits ("5"); so do we.
_SECONDS_TEXT = re.compile(r"[1-9][0-9]{0,7}")


@dataclass(frozen=True)
class StartRequest:
    """A validated `session.start`; `None` means "use the model's default"."""

    prompt: str
    format: str = FORMAT_M4S
    model: str | None = None
    negative_prompt: str | None = None
    width: int | None = None
    height: int | None = None
    fps: int | None = None
    num_frames: int | None = None
    seconds: float | None = None
    seed: int | None = None
    num_inference_steps: int | None = None
    guidance_scale: float | None = None
    guidance_scale_2: float | None = None
    boundary_ratio: float | None = None
    flow_shift: float | None = None
    true_cfg_scale: float | None = None
    #: `STREAMING_BUFFER`: the session's lead over its player, where the generator paces
    streaming_buffer_seconds: float | None = None
    #: vLLM-Omni 0.32's `streaming_pacing`, or its alias `streaming_buffer_seconds` made one
    #: (rtvideo/core/streaming_pacing.py); None: neither was sent. Where enabled,
    #: `streaming_buffer_seconds` is its lead in seconds; disabled, that is None (0.32's rule)
    streaming_pacing: StreamingPacing | None = None
    #: which of the two names the start used (reported in `ignored_fields` where nothing paces)
    pacing_field: str | None = None
    extra_params: dict[str, Any] = field(default_factory=dict)
    #: the `REQUEST_FIELDS` this start sets (not null), as sent
    request_fields: dict[str, Any] = field(default_factory=dict)
    #: the `image_reference` URL (a data: URL or an http(s) one), in either of vLLM-Omni's forms
    image_reference: str | None = None
    #: in-band timing asked for (`METRICS`)
    metrics: bool = False
    #: `prompts` normalised (weights sum to 1), in the order sent; `prompt` is then the heaviest
    #: text (the first of the heaviest), for readers of one prompt. None: a single-prompt start
    prompts: tuple[tuple[str, float], ...] | None = None
    #: the session's default interpolation as sent (None: the generator's default)
    interpolation: str | None = None

    def sampling_given(self) -> list[str]:
        """The sampling fields this start sets, `extra_params` keys as `extra_params.KEY`."""
        given = [name for name in SAMPLING_FIELDS if getattr(self, name) is not None]
        return given + [f"extra_params.{key}" for key in self.extra_params]


def _as_number(value: Any, name: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ProtocolError(ErrorCode.INVALID_START, f"{name} must be a number, not {json_kind(value)}")
    if not low <= value <= high:
        raise ProtocolError(ErrorCode.INVALID_START, f"{name} must be between {low:g} and {high:g}")
    return float(value)


# --- session.start -----------------------------------------------------------------------
def check_first_message(raw: bytes | str, *, binary: bool = False) -> dict[str, Any]:
    """The rules of a session's first message, one definition for the proxy (which answers
    them itself) and the model: a text frame, within the start limit, a `session.start`
    JSON object. Anything else ends the session, so every failure but the size is `invalid_start`."""
    if binary:
        raise ProtocolError(ErrorCode.INVALID_START, "the first message must be a session.start text frame")
    try:
        obj = decode_object(raw, MAX_START_BYTES)
    except ProtocolError as exc:
        if exc.code is ErrorCode.MESSAGE_TOO_LARGE:
            raise
        raise ProtocolError(ErrorCode.INVALID_START, f"first message must be session.start: {exc.message}") from None
    if obj["type"] != START:
        raise ProtocolError(ErrorCode.INVALID_START, f"first message must be session.start, not {obj['type']}")
    return obj


def check_bounded(value: Any, name: str, *, sized: bool = True) -> None:
    """`value` (a start's free-form object) within `MAX_OBJECT_ENTRIES` entries and
    `MAX_OBJECT_DEPTH` levels, and (`sized`) `MAX_OBJECT_BYTES` as JSON; `invalid_start` naming
    the bound otherwise. The walk stops at the first bound passed, so a huge object costs little."""
    entries = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = list(item.values())
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > MAX_OBJECT_DEPTH:
            raise ProtocolError(ErrorCode.INVALID_START, f"{name} is nested deeper than {MAX_OBJECT_DEPTH} levels")
        entries += len(children)
        if entries > MAX_OBJECT_ENTRIES:
            raise ProtocolError(
                ErrorCode.INVALID_START,
                f"{name} has more than {MAX_OBJECT_ENTRIES} keys and items (docs/protocol.md §7)",
            )
        stack.extend((child, depth + 1) for child in children)
    if sized and len(json.dumps(value, ensure_ascii=False)) > MAX_OBJECT_BYTES:
        raise ProtocolError(ErrorCode.INVALID_START, f"{name} is larger than {MAX_OBJECT_BYTES} bytes as JSON")


def check_object_bounds(fields: Mapping[str, Any]) -> None:
    """Every field of a start within the bounds of a free-form object (`check_bounded`), so
    that no field, named, unlisted (the proxy's own options) or unknown, costs more than one of
    them; the references are bounded in keys and depth only (they may carry a data URL: the
    start's own limit bounds their size); and at most `MAX_START_FIELDS` fields. The proxy
    checks this before a start is recorded or forwarded, the model again in `validate_start`.
    Each check stops at its first bound passed, so a hostile start costs little to refuse."""
    if len(fields) > MAX_START_FIELDS:
        raise ProtocolError(
            ErrorCode.INVALID_START, f"session.start has more than {MAX_START_FIELDS} fields (docs/protocol.md §7)"
        )
    for name, value in fields.items():
        if len(name) > MAX_FIELD_NAME_CHARS:
            raise ProtocolError(
                ErrorCode.INVALID_START, f"a session.start field name is longer than {MAX_FIELD_NAME_CHARS} characters"
            )
        unsized = name == IMAGE_REFERENCE or name.endswith("_reference")
        if isinstance(value, str) and not unsized:
            if len(value) > MAX_OBJECT_BYTES:  # a cheap test first: no copy of a huge string
                raise ProtocolError(ErrorCode.INVALID_START, f"{_shown(name)} is larger than {MAX_OBJECT_BYTES} bytes")
        elif isinstance(value, (dict, list)):
            check_bounded(value, _shown(name), sized=not unsized)


def _shown(name: str) -> str:
    """A field's name for an error: a client's unknown name is cut short, never echoed whole."""
    return name if len(name) <= 64 else f"{name[:61]}..."


def validate_start(obj: Mapping[str, Any]) -> StartRequest:
    """Field-level validation of a decoded `session.start` object."""
    fields = dict(obj)
    for name in _START_OBJECT_FIELDS:
        if fields.get(name) is not None and not isinstance(fields[name], dict):
            raise ProtocolError(ErrorCode.INVALID_START, f"{name} must be an object, not {json_kind(fields[name])}")
    check_object_bounds(fields)
    sampling = fields.pop("sampling_params", None)
    if sampling is not None:
        extra = dict(fields.get("extra_params") or {})
        for key, value in sampling.items():  # request fields are lifted, the rest are extras
            if key in START_FIELDS and key not in ("type", "sampling_params", "extra_params"):
                fields.setdefault(key, value)
            else:
                extra.setdefault(key, value)
        fields["extra_params"] = extra
    unknown = sorted(set(fields) - START_FIELDS)
    if unknown:
        raise ProtocolError(ErrorCode.INVALID_START, f"unknown session.start field(s): {', '.join(unknown)}")
    values: dict[str, Any] = _scene(fields)
    fmt = fields.get("format")
    if fmt is not None:
        if not isinstance(fmt, str):
            raise ProtocolError(ErrorCode.INVALID_START, f"format must be a string, not {json_kind(fmt)}")
        if fmt != FORMAT_M4S:
            raise ProtocolError(ErrorCode.UNSUPPORTED_FORMAT, f"format {fmt!r} is not supported; use 'm4s'")
        values["format"] = fmt
    for name in ("model", "negative_prompt"):
        if fields.get(name) is not None:
            if not isinstance(fields[name], str):
                raise ProtocolError(ErrorCode.INVALID_START, f"{name} must be a string")
            if len(fields[name]) > MAX_PROMPT_CHARS:
                raise ProtocolError(ErrorCode.INVALID_START, f"{name} is longer than {MAX_PROMPT_CHARS} characters")
            values[name] = fields[name]
    for name, (low, high) in _START_INT_FIELDS.items():
        if fields.get(name) is not None:
            values[name] = as_int(fields[name], name, low, high, ErrorCode.INVALID_START)
    if isinstance(fields.get("seconds"), str) and _SECONDS_TEXT.fullmatch(fields["seconds"]):
        fields["seconds"] = int(fields["seconds"])  # vLLM-Omni's form: a string of digits
    for name, (lowest, highest) in _START_NUMBER_FIELDS.items():
        if fields.get(name) is not None:
            values[name] = _as_number(fields[name], name, lowest, highest)
    if values.get("seconds") == 0.0:
        raise ProtocolError(ErrorCode.INVALID_START, "seconds must be greater than 0")
    if fields.get("size") is not None:
        values["width"], values["height"] = _parse_size(fields["size"])
    if fields.get("extra_params") is not None:
        values["extra_params"] = fields["extra_params"]
    if fields.get(IMAGE_REFERENCE) is not None:
        values["image_reference"] = _image_reference_url(fields[IMAGE_REFERENCE])
    if METRICS in fields:
        if not isinstance(fields[METRICS], bool):
            raise ProtocolError(ErrorCode.INVALID_START, f"metrics must be a boolean, not {json_kind(fields[METRICS])}")
        values["metrics"] = fields[METRICS]
    values.update(_pacing(fields, values.get(STREAMING_BUFFER)))
    request_fields = {name: fields[name] for name in REQUEST_FIELDS if fields.get(name) is not None}
    for name, value in request_fields.items():
        _check_request_field(name, value)
    if request_fields:
        values["request_fields"] = request_fields
    return StartRequest(**values)


def _pacing(fields: Mapping[str, Any], buffer_seconds: float | None) -> dict[str, Any]:
    """`streaming_pacing` or its alias, normalised as 0.32's `normalize_streaming_pacing` does:
    both at once is `invalid_start`; the alias is a pacing with that lead; a disabled pacing
    leaves no lead."""
    given = fields.get(STREAMING_PACING)
    if given is None and buffer_seconds is None:
        return {}
    if given is not None and buffer_seconds is not None:
        raise ProtocolError(
            ErrorCode.INVALID_START, f"use {STREAMING_PACING} or {STREAMING_BUFFER}, not both (they are one setting)"
        )
    if given is not None:
        pacing, name = parse_streaming_pacing(given), STREAMING_PACING
    else:
        assert buffer_seconds is not None
        pacing, name = from_buffer_seconds(buffer_seconds), STREAMING_BUFFER
    lead = pacing.max_lead_seconds if pacing.enabled else None
    return {"streaming_pacing": pacing, "pacing_field": name, STREAMING_BUFFER: lead}


def _scene(fields: Mapping[str, Any]) -> dict[str, Any]:
    """A start's `prompt`, or its `prompts` (exactly one of the two), and its `interpolation`."""
    bad = ErrorCode.INVALID_START
    values: dict[str, Any] = {}
    if fields.get("interpolation") is not None:
        values["interpolation"] = require_interpolation(fields["interpolation"], "interpolation", bad, INTERPOLATIONS)
    if fields.get("prompts") is None:
        if "prompt" not in fields:
            raise ProtocolError(bad, "session.start needs a prompt (or prompts)")
        values["prompt"] = require_prompt(fields["prompt"], "prompt", bad)
        return values
    if fields.get("prompt") is not None:
        raise ProtocolError(bad, "session.start carries prompt or prompts, not both")
    prompts = normalise(require_prompts(fields["prompts"], "prompts", bad))
    values["prompts"] = prompts
    values["prompt"] = max(prompts, key=lambda item: item[1])[0]
    return values


def _check_request_field(name: str, value: Any) -> None:
    """One `REQUEST_FIELDS` value against vLLM-Omni's type for it (null was taken as absent)."""
    kind, low, high = REQUEST_FIELDS[name]
    bad = ErrorCode.INVALID_START
    if kind == "string":
        if not isinstance(value, str):
            raise ProtocolError(bad, f"{name} must be a string, not {json_kind(value)}")
        if len(value) > MAX_PROMPT_CHARS:
            raise ProtocolError(bad, f"{name} is longer than {MAX_PROMPT_CHARS} characters")
    elif kind == "quality":
        if value not in QUALITY_LEVELS:
            raise ProtocolError(bad, f"quality must be one of {list(QUALITY_LEVELS)}")
    elif kind == "int":
        as_int(value, name, int(low), int(high), bad)
    elif kind in ("number", "positive"):
        _as_number(value, name, low, high)
        if kind == "positive" and value <= 0:
            raise ProtocolError(bad, f"{name} must be greater than 0")
    elif kind == "boolean":
        if not isinstance(value, bool):
            raise ProtocolError(bad, f"{name} must be true or false, not {json_kind(value)}")
    elif kind == "object":
        if not isinstance(value, dict):
            raise ProtocolError(bad, f"{name} must be an object, not {json_kind(value)}")
    elif not (isinstance(value, dict) or (isinstance(value, list) and all(isinstance(v, dict) for v in value))):
        raise ProtocolError(bad, f"{name} must be an object or an array of objects")


def _image_reference_url(value: Any) -> str:
    """The URL of an `image_reference` (shape only): `{"image_url": URL}` as vLLM-Omni's model has it,
    or the URL string itself. A file id or a list (vLLM-Omni's other forms) has no meaning here."""
    bad = ErrorCode.INVALID_START
    if isinstance(value, list):
        raise ProtocolError(bad, "image_reference must be a single image reference")
    if isinstance(value, dict):
        if "file_id" in value:
            raise ProtocolError(bad, "image_reference.file_id is not supported here: send image_url")
        extra = sorted(set(value) - {"image_url"})
        if extra or "image_url" not in value:
            raise ProtocolError(
                bad, 'image_reference must be {"image_url": "data:image/...;base64,..." or "https://..."}'
            )
        value = value["image_url"]
        name = "image_reference.image_url"
    else:
        name = "image_reference"
    if not isinstance(value, str):
        raise ProtocolError(bad, f"{name} must be a string, not {json_kind(value)}")
    if not value.startswith(("data:image/", "http://", "https://")):
        raise ProtocolError(bad, f"{name} must be a data:image/... URL or an http(s) URL")
    return value


def _parse_size(size: Any) -> tuple[int, int]:
    if not isinstance(size, str):
        raise ProtocolError(ErrorCode.INVALID_START, "size must be a string like '256x256'")
    parts = [part.strip() for part in size.lower().split("x")]
    if len(parts) != 2 or not all(part.isascii() and part.isdigit() and len(part) <= 6 for part in parts):
        raise ProtocolError(ErrorCode.INVALID_START, f"size {size[:40]!r} is not of the form 'WIDTHxHEIGHT'")
    width, height = (int(part) for part in parts)
    for name, value in (("width", width), ("height", height)):
        as_int(value, f"size {name}", 1, MAX_DIMENSION, ErrorCode.INVALID_START)
    return width, height
