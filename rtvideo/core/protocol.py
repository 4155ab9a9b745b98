"""The message envelope: limits, message types, JSON decoding, and the messages after the start
(docs/protocol.md §2, §7).

A `session.start`'s fields are `rtvideo.core.start_request`'s, the server messages' builders
`rtvideo.core.server_messages`', the proxy's `session.resume` `rtvideo.core.resume`'s; each
of them builds on this module's limits and decoding.

Pure: bytes or str in, dataclasses or dicts out. Every failure is a
`ProtocolError` with a stable code, never another exception type.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rtvideo.core.errors import ErrorCode, ProtocolError
from rtvideo.core.fields import json_kind
from rtvideo.core.interaction.parse import parse_interaction
from rtvideo.core.interaction.types import InteractionRequest

# --- limits (documented in docs/protocol.md §7) ----------------------------------------
MAX_START_BYTES = 4 * 1024 * 1024
MAX_MESSAGE_BYTES = 128 * 1024
MAX_JSON_DEPTH = 32
# MAX_EVENT_ID_CHARS, MAX_PROMPT_CHARS and MAX_TRANSITION_CHUNKS: `rtvideo.core.fields`
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
#: the owner ends every steer link of its session (docs/protocol.md §9.3); answered by the proxy
REVOKE_STEERING = "session.revoke_steering"
#: the owner ends the session's HLS broadcast, `{"enabled": false}` (docs/protocol.md "Broadcasts");
#: the proxy answers it (a proxy feature: the model refuses it as an unknown type)
BROADCAST = "session.broadcast"
CLIENT_TYPES = (START, INTERACTION, STOP, PING, PLAYBACK, REVOKE_STEERING, BROADCAST)

VIDEO_START = "video.start"
QUEUED = "session.interaction.queued"
CHUNK_METADATA = "video.chunk_metadata"
PONG = "session.pong"
METRICS = "session.metrics"  # in-band timing, only to a start with "metrics": true (docs/protocol.md §3.5)
DONE = "session.done"
ERROR = "error"
STEERING_REVOKED = "session.steering_revoked"  # the answer to REVOKE_STEERING
BROADCAST_ENDED = "session.broadcast_ended"  # the answer to BROADCAST
#: another participant's interaction, told to everyone else of a shared session (docs/protocol.md §9.4)
INTERACTION_SHARED = "session.interaction.shared"


@dataclass(frozen=True)
class StopRequest:
    pass


@dataclass(frozen=True)
class RevokeSteering:
    """The owner ends every steer link (docs/protocol.md §9.3). The proxy answers it; over
    Triton a session has no steerers, and the model answers that none were revoked."""


@dataclass(frozen=True)
class EndBroadcast:
    """The owner ends the session's HLS broadcast (`{"enabled": false}`, docs/protocol.md
    "Broadcasts"). The proxy answers it; over Triton a session has no broadcast (invalid_message)."""


@dataclass(frozen=True)
class PingRequest:
    """`keepalive`: `"keepalive": true` in the ping, a keep-alive (the proxy's, docs/protocol.md
    §8): it keeps the sequence from Triton's idle timeout, but is not progress for the stall
    clock (§7) as a client's ping is."""

    keepalive: bool = False
    #: the proxy's pause of a detached session (docs/triton-model.md): True pauses the generator at
    #: its next chunk boundary, False resumes it; None (every client ping) leaves it as it is
    pause: bool | None = None
    #: `"status": true`: a health probe that asks for the model's status in its pong (§8); a
    #: plain ping gets the plain pong
    status: bool = False


#: a playhead report's positions, in media seconds: the longest session a start may ask for
MAX_PLAYBACK_SECONDS = float(MAX_NUM_FRAMES)


@dataclass(frozen=True)
class PlaybackReport:
    """A validated `session.playback`: the media time the client shows now and, optionally, how
    much it holds beyond it. Only well-formed: whether it is plausible is the pacing's to clamp
    (rtvideo/core/pacing.py), never an error."""

    position_seconds: float
    buffered_seconds: float | None = None


SessionMessage = InteractionRequest | StopRequest | PingRequest | PlaybackReport | RevokeSteering | EndBroadcast


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
        raise ProtocolError(ErrorCode.INVALID_MESSAGE, f"message must be a JSON object, not {json_kind(value)}")
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
        return PingRequest(
            keepalive=obj.get("keepalive") is True,
            pause=pause if isinstance(pause, bool) else None,
            status=obj.get("status") is True,
        )
    if kind == PLAYBACK:
        return validate_playback(obj)
    if kind == REVOKE_STEERING:
        return RevokeSteering()
    if kind == BROADCAST:
        return validate_broadcast(obj)
    return validate_interaction(obj)


def validate_broadcast(obj: Mapping[str, Any]) -> EndBroadcast:
    """`session.broadcast`: only `{"enabled": false}` (a broadcast is begun by session.start alone)."""
    if obj.get("enabled") is not False:
        raise ProtocolError(
            ErrorCode.INVALID_MESSAGE,
            'session.broadcast takes {"enabled": false}: a broadcast is begun only by session.start',
        )
    return EndBroadcast()


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
                ErrorCode.INVALID_MESSAGE, f"session.playback {name} must be a number, not {json_kind(value)}"
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


#: the one parser of `session.interaction` (`rtvideo.core.interaction.parse`)
validate_interaction = parse_interaction
