"""Client message parsing/validation and server message construction (docs/protocol.md §2–3).

Pure: bytes or str in, dataclasses or dicts out. Every failure is a
`ProtocolError` with a stable code, never another exception type.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rtvideo.core import camera
from rtvideo.core.camera import CameraCommand
from rtvideo.core.errors import ErrorCode, ProtocolError
from rtvideo.core.event_types import EVENT_FIELDS, OmniInteractionEvent

# --- limits (documented in docs/protocol.md §7) ----------------------------------------
MAX_START_BYTES = 4 * 1024 * 1024
MAX_MESSAGE_BYTES = 128 * 1024
MAX_JSON_DEPTH = 32
MAX_EVENT_ID_CHARS = 256
#: prompts (start, interaction, negative) in characters: far above what a text encoder reads
#: (MiniLM 256 tokens, UMT5 512), far below what could stall an embedding or fill a cache
MAX_PROMPT_CHARS = 4096
MAX_TRANSITION_CHUNKS = 1000
MAX_DIMENSION = 4096
MAX_FPS = 120
MAX_NUM_FRAMES = 10_000_000
MAX_SEED = 2**63 - 1

FORMAT_M4S = "m4s"

# --- message types ----------------------------------------------------------------------
START = "session.start"
INTERACTION = "session.interaction"
STOP = "session.stop"
PING = "session.ping"
PLAYBACK = "session.playback"  # a playhead report (docs/protocol.md §2.6); clients may ignore it
CLIENT_TYPES = (START, INTERACTION, STOP, PING, PLAYBACK)

VIDEO_START = "video.start"
QUEUED = "session.interaction.queued"
CHUNK_METADATA = "video.chunk_metadata"
PONG = "session.pong"
DONE = "session.done"
ERROR = "error"

MAX_INFERENCE_STEPS = 10_000
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
}
_START_STR_FIELDS = ("model", "negative_prompt", "size", "format", "prompt")
_START_OBJECT_FIELDS = ("extra_params", "sampling_params")
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
#: only its shape is checked here, the backend decodes or fetches it (rtvideo/backend/image_reference.py)
IMAGE_REFERENCE = "image_reference"
START_FIELDS = frozenset(
    {
        "type",
        *_START_INT_FIELDS,
        *_START_NUMBER_FIELDS,
        *_START_STR_FIELDS,
        *_START_OBJECT_FIELDS,
        *REQUEST_FIELDS,
        IMAGE_REFERENCE,
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
    extra_params: dict[str, Any] = field(default_factory=dict)
    #: the `REQUEST_FIELDS` this start sets (not null), as sent
    request_fields: dict[str, Any] = field(default_factory=dict)
    #: the `image_reference` URL (a data: URL or an http(s) one), in either of vLLM-Omni's forms
    image_reference: str | None = None

    def sampling_given(self) -> list[str]:
        """The sampling fields this start sets, `extra_params` keys as `extra_params.KEY`."""
        given = [name for name in SAMPLING_FIELDS if getattr(self, name) is not None]
        return given + [f"extra_params.{key}" for key in self.extra_params]


@dataclass(frozen=True)
class InteractionRequest:
    """A validated `session.interaction`; `event_id` is None when the server must assign one."""

    event: OmniInteractionEvent
    event_id: str | None = None
    transition_chunks: int | None = None
    #: the event's `multi_modal_data.camera`, parsed once here (not part of its identity: the
    #: event is); None without one
    camera: CameraCommand | None = field(default=None, compare=False)

    @property
    def fingerprint(self) -> bytes:
        """Canonical payload identity for idempotency (docs/protocol.md §4): the SHA-256 of the
        canonical JSON, so a session keeps 32 bytes per event id, whatever the prompt's size."""
        canonical = json.dumps(
            {"event": self.event, "transition_chunks": self.transition_chunks},
            sort_keys=True,
            separators=(",", ":"),
        )
        return hashlib.sha256(canonical.encode("ascii")).digest()

    def with_event_id(self) -> InteractionRequest:
        """The same request with a server-generated id when the client sent none."""
        if self.event_id is not None:
            return self
        return InteractionRequest(self.event, str(uuid.uuid4()), self.transition_chunks, self.camera)


@dataclass(frozen=True)
class StopRequest:
    pass


@dataclass(frozen=True)
class PingRequest:
    """`keepalive`: `"keepalive": true` in the ping, a keep-alive (the proxy's, docs/protocol.md
    §8): it keeps the sequence from Triton's idle timeout, but is not progress for the stall
    clock (§7) as a client's ping is."""

    keepalive: bool = False
    #: the proxy's pause of a detached session (docs/triton-model.md): True pauses the generator at
    #: its next chunk boundary, False resumes it; None (every client ping) leaves it as it is
    pause: bool | None = None


#: a playhead report's positions, in media seconds: the longest session a start may ask for
MAX_PLAYBACK_SECONDS = float(MAX_NUM_FRAMES)


@dataclass(frozen=True)
class PlaybackReport:
    """A validated `session.playback`: the media time the client shows now and, optionally, how
    much it holds beyond it. Only well-formed: whether it is plausible is the pacing's to clamp
    (rtvideo/core/pacing.py), never an error."""

    position_seconds: float
    buffered_seconds: float | None = None


SessionMessage = InteractionRequest | StopRequest | PingRequest | PlaybackReport


# --- decoding ----------------------------------------------------------------------------
def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:20]} is out of range")
    return value


def _depth(value: Any) -> int:
    """Nesting depth, iteratively so that it cannot itself overflow the stack."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, level = stack.pop()
        children: Iterable[Any]
        if isinstance(node, dict):
            children = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        deepest = max(deepest, level)
        stack.extend((child, level + 1) for child in children)
    return deepest


def decode_object(raw: bytes | str, limit: int) -> dict[str, Any]:
    """Size check on the raw bytes, then UTF-8, JSON, nesting depth and object shape."""
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    if len(data) > limit:
        raise ProtocolError(ErrorCode.MESSAGE_TOO_LARGE, f"message is {len(data)} bytes; the limit is {limit} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProtocolError(ErrorCode.INVALID_JSON, f"message is not valid UTF-8 ({exc.reason})") from None
    try:
        value = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except RecursionError:
        raise ProtocolError(ErrorCode.INVALID_JSON, f"JSON is nested deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as exc:  # JSONDecodeError and the number guards above
        raise ProtocolError(ErrorCode.INVALID_JSON, f"message is not valid JSON: {exc}") from None
    if _depth(value) > MAX_JSON_DEPTH:
        raise ProtocolError(ErrorCode.INVALID_JSON, f"JSON is nested deeper than {MAX_JSON_DEPTH} levels")
    if _LONE_SURROGATE.search(text) and _has_lone_surrogate(value):
        raise ProtocolError(
            ErrorCode.INVALID_JSON,
            "message contains a lone UTF-16 surrogate escape (e.g. \\ud800), which is not Unicode text",
        )
    if not isinstance(value, dict):
        raise ProtocolError(ErrorCode.INVALID_MESSAGE, f"message must be a JSON object, not {_json_kind(value)}")
    kind = value.get("type")
    if kind is None:
        raise ProtocolError(ErrorCode.INVALID_MESSAGE, "message has no 'type'")
    if not isinstance(kind, str) or kind not in CLIENT_TYPES:
        raise ProtocolError(
            ErrorCode.INVALID_MESSAGE,
            f"unknown message type {kind!r}; expected one of {', '.join(CLIENT_TYPES)}",
        )
    return value


# A \\uD800-\\uDFFF escape in the raw text; only then is the decoded value searched.
_LONE_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE_CHAR = re.compile("[\ud800-\udfff]")


def _has_lone_surrogate(value: Any) -> bool:
    """Whether any string (key or value) holds a surrogate that did not pair up: valid JSON,
    but it cannot be encoded as UTF-8, so nothing downstream could send it on."""
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            if _SURROGATE_CHAR.search(node):
                return True
        elif isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return False


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def as_int(value: Any, name: str, low: int, high: int, code: ErrorCode) -> int:
    """A JSON integer (3.0 counts as 3; booleans, strings and 2.5 do not) within [low, high]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ProtocolError(code, f"{name} must be an integer, not {_json_kind(value)}")
    if isinstance(value, float):
        if not value.is_integer():
            raise ProtocolError(code, f"{name} must be an integer, not {value!r}")
        value = int(value)
    if not low <= value <= high:
        raise ProtocolError(code, f"{name} must be between {low} and {high}, not {_short(value)}")
    return value


def _short(value: int | float) -> str:
    text = str(value)
    return text if len(text) <= 24 else text[:10] + "…" + f" ({len(text)} digits)"


def _as_number(value: Any, name: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ProtocolError(ErrorCode.INVALID_START, f"{name} must be a number, not {_json_kind(value)}")
    if not low <= value <= high:
        raise ProtocolError(ErrorCode.INVALID_START, f"{name} must be between {low:g} and {high:g}")
    return float(value)


def _require_prompt(value: Any, name: str, code: ErrorCode) -> str:
    if not isinstance(value, str):
        raise ProtocolError(code, f"{name} must be a string, not {_json_kind(value)}")
    if not value.strip():
        raise ProtocolError(code, f"{name} must not be empty")
    if len(value) > MAX_PROMPT_CHARS:
        raise ProtocolError(code, f"{name} is {len(value)} characters; the limit is {MAX_PROMPT_CHARS}")
    return value


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


def parse_start(raw: bytes | str) -> StartRequest:
    """Validate the first message of a session; anything but a valid start ends the session."""
    return validate_start(check_first_message(raw))


def validate_start(obj: Mapping[str, Any]) -> StartRequest:
    """Field-level validation of a decoded `session.start` object."""
    fields = dict(obj)
    for name in _START_OBJECT_FIELDS:
        if fields.get(name) is not None and not isinstance(fields[name], dict):
            raise ProtocolError(ErrorCode.INVALID_START, f"{name} must be an object, not {_json_kind(fields[name])}")
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
    if "prompt" not in fields:
        raise ProtocolError(ErrorCode.INVALID_START, "session.start needs a prompt")
    values: dict[str, Any] = {"prompt": _require_prompt(fields["prompt"], "prompt", ErrorCode.INVALID_START)}
    fmt = fields.get("format")
    if fmt is not None:
        if not isinstance(fmt, str):
            raise ProtocolError(ErrorCode.INVALID_START, f"format must be a string, not {_json_kind(fmt)}")
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
    request_fields = {name: fields[name] for name in REQUEST_FIELDS if fields.get(name) is not None}
    for name, value in request_fields.items():
        _check_request_field(name, value)
    if request_fields:
        values["request_fields"] = request_fields
    return StartRequest(**values)


def _check_request_field(name: str, value: Any) -> None:
    """One `REQUEST_FIELDS` value against vLLM-Omni's type for it (null was taken as absent)."""
    kind, low, high = REQUEST_FIELDS[name]
    bad = ErrorCode.INVALID_START
    if kind == "string":
        if not isinstance(value, str):
            raise ProtocolError(bad, f"{name} must be a string, not {_json_kind(value)}")
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
            raise ProtocolError(bad, f"{name} must be true or false, not {_json_kind(value)}")
    elif kind == "object":
        if not isinstance(value, dict):
            raise ProtocolError(bad, f"{name} must be an object, not {_json_kind(value)}")
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
        raise ProtocolError(bad, f"{name} must be a string, not {_json_kind(value)}")
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


# --- later messages ----------------------------------------------------------------------
def decode_later(raw: bytes | str, *, binary: bool = False) -> dict[str, Any]:
    """A message after the start, decoded: a text frame, within the message limit, a known
    type, and not a second `session.start`. Errors about one message leave the session running."""
    if binary:
        raise ProtocolError(ErrorCode.INVALID_MESSAGE, "binary frames are not accepted from clients; send JSON text")
    obj = decode_object(raw, MAX_MESSAGE_BYTES)
    if obj["type"] == START:
        raise ProtocolError(ErrorCode.INVALID_MESSAGE, "the session has already started")
    return obj


def parse_message(raw: bytes | str) -> SessionMessage:
    """Validate a message after the start (see `decode_later`)."""
    obj = decode_later(raw)
    kind = obj["type"]
    if kind == STOP:
        return StopRequest()
    if kind == PING:
        pause = obj.get("pause")
        return PingRequest(keepalive=obj.get("keepalive") is True, pause=pause if isinstance(pause, bool) else None)
    if kind == PLAYBACK:
        return validate_playback(obj)
    return validate_interaction(obj)


def validate_playback(obj: Mapping[str, Any]) -> PlaybackReport:
    """docs/protocol.md §2.6 `session.playback`: numbers in [0, MAX_PLAYBACK_SECONDS], the
    buffer optional; other fields are ignored, like a stop's or a ping's."""
    values: list[float | None] = []
    for name in ("position_seconds", "buffered_seconds"):
        value = obj.get(name)
        if value is None and name == "buffered_seconds":
            values.append(None)
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ProtocolError(
                ErrorCode.INVALID_MESSAGE, f"session.playback {name} must be a number, not {_json_kind(value)}"
            )
        if not 0 <= value <= MAX_PLAYBACK_SECONDS:
            raise ProtocolError(
                ErrorCode.INVALID_MESSAGE, f"session.playback {name} must be between 0 and {MAX_PLAYBACK_SECONDS:g}"
            )
        values.append(float(value))
    position = values[0]
    assert position is not None
    return PlaybackReport(position, values[1])


def is_stop(raw: bytes | str, *, binary: bool = False) -> bool:
    """Whether a message after the start is a `session.stop` (one `decode_later` accepts)."""
    try:
        return decode_later(raw, binary=binary)["type"] == STOP
    except ProtocolError:
        return False


def validate_interaction(obj: Mapping[str, Any]) -> InteractionRequest:
    """docs/protocol.md §2.2 `session.interaction` rules; failures record nothing."""
    bad = ErrorCode.INVALID_INTERACTION
    interaction = obj.get("interaction")
    if not isinstance(interaction, dict):
        raise ProtocolError(bad, f"interaction must be an object, not {_json_kind(interaction)}")
    event_id = interaction.get("event_id")
    if event_id is not None:
        if not isinstance(event_id, str) or not event_id:
            raise ProtocolError(bad, "event_id must be a non-empty string")
        if len(event_id) > MAX_EVENT_ID_CHARS:
            raise ProtocolError(bad, f"event_id is longer than {MAX_EVENT_ID_CHARS} characters")
    report_id = event_id
    unknown_keys = sorted(set(interaction) - {"event_id", "event", "transition_chunks"})
    if unknown_keys:
        raise ProtocolError(bad, f"unknown interaction field(s): {', '.join(unknown_keys)}", report_id)
    event = interaction.get("event")
    if not isinstance(event, dict):
        raise ProtocolError(bad, f"interaction.event must be an object, not {_json_kind(event)}", report_id)
    unknown = sorted(set(event) - EVENT_FIELDS)
    if unknown:
        raise ProtocolError(bad, f"unknown event field(s): {', '.join(unknown)}", report_id)
    try:
        event, command = _event_parts(event, bad)
    except ProtocolError as exc:
        raise ProtocolError(exc.code, exc.message, report_id) from None
    chunks = interaction.get("transition_chunks")
    if chunks is not None:
        try:
            chunks = as_int(chunks, "transition_chunks", 0, MAX_TRANSITION_CHUNKS, bad)
        except ProtocolError as exc:
            raise ProtocolError(exc.code, exc.message, report_id) from None
    return InteractionRequest(
        event=OmniInteractionEvent(**event), event_id=event_id, transition_chunks=chunks, camera=command
    )


def _event_parts(event: dict[str, Any], bad: ErrorCode) -> tuple[dict[str, Any], CameraCommand | None]:
    """An event's `prompt` and/or `multi_modal_data` (vLLM-Omni 0.30's rule, docs/protocol.md
    §2.2): at least one; a `null` one is absent (and dropped, as vLLM-Omni's server drops it);
    each modality an object; `camera` valid (`rtvideo.core.camera`). A prompt-only event is
    checked exactly as before multi_modal_data existed."""
    mm = event.get("multi_modal_data")
    if mm is None:
        if "prompt" not in event:
            raise ProtocolError(
                bad, "an event needs a prompt and/or multi_modal_data: interaction.event.prompt is required"
            )
        _require_prompt(event["prompt"], "event.prompt", bad)
        return (
            {k: v for k, v in event.items() if k != "multi_modal_data"} if "multi_modal_data" in event else event
        ), None
    if not isinstance(mm, dict):
        raise ProtocolError(bad, f"event.multi_modal_data must be an object, not {_json_kind(mm)}")
    if not mm:
        raise ProtocolError(bad, "event.multi_modal_data must be a non-empty object when provided")
    for modality, payload in mm.items():
        if not isinstance(payload, dict):
            raise ProtocolError(bad, f"event.multi_modal_data[{modality[:40]!r}] must be an object")
    command = None
    if camera.MODALITY in mm:
        try:
            command = camera.parse_camera(mm[camera.MODALITY])
        except camera.CameraError as exc:
            raise ProtocolError(bad, f"event.multi_modal_data.camera: {exc}") from None
    if event.get("prompt") is not None:
        _require_prompt(event["prompt"], "event.prompt", bad)
        return event, command
    return {k: v for k, v in event.items() if k != "prompt"}, command


# --- server messages ---------------------------------------------------------------------
def encode(message: Mapping[str, Any]) -> str:
    """Compact JSON for the wire."""
    return json.dumps(message, separators=(",", ":"), ensure_ascii=False)


def new_request_id() -> str:
    return f"video_stream-{uuid.uuid4().hex}"


def video_start(request_id: str, fmt: str, config: Mapping[str, Any]) -> dict[str, Any]:
    return {"type": VIDEO_START, "request_id": request_id, "format": fmt, "config": dict(config)}


def queued(request_id: str | None, event_id: str) -> dict[str, Any]:
    return {"type": QUEUED, "request_id": request_id, "event_id": event_id}


def pong() -> dict[str, Any]:
    return {"type": PONG}


def done(
    request_id: str | None,
    *,
    chunks: int,
    stopped: bool,
    unapplied_event_ids: list[str],
    unfinished_event_ids: list[str],
) -> dict[str, Any]:
    return {
        "type": DONE,
        "request_id": request_id,
        "chunks": chunks,
        "stopped": stopped,
        "unapplied_event_ids": list(unapplied_event_ids),
        "unfinished_event_ids": list(unfinished_event_ids),
    }


def error(
    code: ErrorCode, message: str, *, request_id: str | None = None, event_id: str | None = None
) -> dict[str, Any]:
    out: dict[str, Any] = {"type": ERROR, "code": code.value, "message": message}
    if request_id is not None:
        out["request_id"] = request_id
    if event_id is not None:
        out["event_id"] = event_id
    return out


def error_from(exc: ProtocolError, request_id: str | None = None) -> dict[str, Any]:
    return error(exc.code, exc.message, request_id=request_id, event_id=exc.event_id)


# --- session resume (a proxy feature, docs/protocol.md §9) ------------------------------
#: the first message of a connection that takes over a detached session; the proxy answers it
#: itself (it is not a Triton request, so it is not one of CLIENT_TYPES)
RESUME = "session.resume"
#: a resume token's length bound, in characters (a proxy's tokens are far shorter)
MAX_RESUME_TOKEN_CHARS = 256


@dataclass(frozen=True)
class ResumeRequest:
    """`session.resume`: the token from the last `video.start`, and the transport index of the
    last payload the client fully received (-1: none)."""

    resume_token: str
    last_transport_chunk_index: int


def is_resume(raw: bytes | str, *, binary: bool = False) -> bool:
    """Whether a first message is a `session.resume` (cheap: any JSON object of that type)."""
    if binary:
        return False
    if (RESUME not in raw) if isinstance(raw, str) else (RESUME.encode() not in raw):
        return False  # most first messages are starts: no second parse of a large one
    try:
        obj = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return False
    return isinstance(obj, dict) and obj.get("type") == RESUME


def parse_resume(raw: bytes | str) -> ResumeRequest:
    """Validate a `session.resume`; every failure is `invalid_resume`."""
    bad = ErrorCode.INVALID_RESUME
    try:
        obj = decode_object_any(raw, MAX_MESSAGE_BYTES)
    except ProtocolError as exc:
        raise ProtocolError(bad, f"session.resume: {exc.message}") from None
    unknown = sorted(set(obj) - {"type", "resume_token", "last_transport_chunk_index"})
    if unknown:
        raise ProtocolError(bad, f"unknown session.resume field(s): {', '.join(unknown)}")
    token = obj.get("resume_token")
    if not isinstance(token, str) or not token or len(token) > MAX_RESUME_TOKEN_CHARS:
        raise ProtocolError(
            bad, f"resume_token must be a non-empty string of at most {MAX_RESUME_TOKEN_CHARS} characters"
        )
    last = as_int(obj.get("last_transport_chunk_index"), "last_transport_chunk_index", -1, MAX_NUM_FRAMES, bad)
    return ResumeRequest(token, last)


def decode_object_any(raw: bytes | str, limit: int) -> dict[str, Any]:
    """A JSON object within `limit` bytes, of any `type` (the proxy's own first messages)."""
    size = len(raw.encode("utf-8", "surrogatepass")) if isinstance(raw, str) else len(raw)
    if size > limit:
        raise ProtocolError(ErrorCode.MESSAGE_TOO_LARGE, f"message is {size} bytes; the limit is {limit}")
    try:
        obj = json.loads(raw, parse_constant=_reject_constant)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ProtocolError(ErrorCode.INVALID_JSON, f"not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ProtocolError(ErrorCode.INVALID_JSON, "a message must be a JSON object")
    return obj
