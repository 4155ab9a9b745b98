"""The Triton wire format of model `realtime_video` (docs/protocol.md §8), in one place.

No Triton import: the model (`pb_utils`), the proxy (`tritonclient.grpc.aio`) and the
blocking client (`tritonclient.grpc`) each wrap these arrays in their own tensor type,
so the tensor names, the packing and the reply shape cannot drift apart.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from rtvideo.core import server_messages
from rtvideo.triton.access import SESSION_SECRET_PARAMETER

#: input: one client message, UTF-8 JSON, BYTES [1]
REQUEST = "REQUEST"
#: outputs: one server message, UTF-8 JSON, BYTES [1]; the binary payload after it, UINT8 [-1]
META = "META"
DATA = "DATA"
#: sequence-batcher control inputs (config.pbtxt `control_input`)
START = "START"
END = "END"
CORRID = "CORRID"
#: request id the proxy gives `session.start`: its responses are the session's stream
START_TAG = "start"
#: request parameter with the W3C trace context of a traced session (docs/operations.md "Traces")
TRACEPARENT_PARAMETER = "traceparent"


@dataclass(frozen=True)
class Reply:
    """One response: the request it answers (its request id), the server message as sent
    (`text`) and parsed (`message`, None for a flags-only response), the binary payload,
    and when it arrived (`time.perf_counter()`, 0 when the receiver does not record it)."""

    tag: str
    text: str
    message: dict[str, Any] | None
    data: bytes
    received: float = 0.0


def secret_parameters(secret: str | None, traceparent: str | None = None) -> dict[str, str] | None:
    """A request's parameters carrying the session's secret (docs/protocol.md §8) and, when the
    proxy traces the session, its W3C `traceparent` (docs/operations.md "Traces"): the
    `parameters=` of tritonclient's calls (None: no parameters, as for the health probe)."""
    parameters = {SESSION_SECRET_PARAMETER: secret} if secret is not None else {}
    if traceparent is not None:
        parameters[TRACEPARENT_PARAMETER] = traceparent
    return parameters or None


def request_traceparent(parameters: str | None) -> str | None:
    """The W3C `traceparent` a request carries (its string parameter `traceparent`, read from
    `request.parameters()` as for the secret); None when absent or not a string."""
    return _string_parameter(parameters, TRACEPARENT_PARAMETER)


def session_secret(parameters: str | None) -> str | None:
    """The session secret a request carries: the string parameter `rtvideo_session_secret` of
    the request's parameters as the Python backend gives them (`request.parameters()`, a JSON
    object as text); None when absent, not a string, or the text is not a JSON object."""
    return _string_parameter(parameters, SESSION_SECRET_PARAMETER)


def _string_parameter(parameters: str | None, name: str) -> str | None:
    if not parameters:
        return None
    try:
        values = json.loads(parameters)
    except ValueError:
        return None
    value = values.get(name) if isinstance(values, dict) else None
    return value if isinstance(value, str) else None


def message_bytes(message: Mapping[str, Any] | str | bytes) -> bytes:
    """A client message as the bytes of a REQUEST tensor (a mapping is JSON-encoded)."""
    if isinstance(message, Mapping):  # ASCII escapes: any str the caller holds is sent as written
        return json.dumps(message, separators=(",", ":")).encode("ascii")
    if isinstance(message, str):
        return message.encode("utf-8", "surrogatepass")  # bad text reaches the validator as sent
    return bytes(message)


def request_array(message: Mapping[str, Any] | str | bytes) -> np.ndarray:
    """The REQUEST tensor's value: BYTES [1]."""
    return np.array([message_bytes(message)], dtype=np.object_)


def request_payload(array: np.ndarray) -> bytes:
    """The client message of a REQUEST tensor, copied out (Triton frees inputs after execute())."""
    return bytes(array.reshape(-1)[0])


def control_value(array: np.ndarray | None) -> int:
    """A START/END/CORRID control input's scalar (0 when the input is absent)."""
    return int(array.reshape(-1)[0]) if array is not None else 0


def response_arrays(message: Mapping[str, Any], data: bytes = b"") -> tuple[np.ndarray, np.ndarray]:
    """META and DATA values of one response."""
    meta = np.array([_meta_bytes(message)], dtype=np.object_)
    return meta, np.frombuffer(data, dtype=np.uint8)


def _meta_bytes(message: Mapping[str, Any]) -> bytes:
    """UTF-8 JSON; never raises on text: the core refuses unpaired surrogates at the door, and
    should one come from elsewhere it travels as a JSON escape rather than failing the send."""
    try:
        return server_messages.encode(message).encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(message, separators=(",", ":")).encode("ascii")


def parse_reply(tag: str, meta: np.ndarray | None, data: np.ndarray | None, received: float = 0.0) -> Reply:
    """A response's outputs as a `Reply`; a response without META is flags-only."""
    payload = data.tobytes() if data is not None else b""
    if meta is None or meta.size == 0:
        return Reply(tag, "", None, payload, received)
    raw = meta.reshape(-1)[0]
    text = raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)
    return Reply(tag, text, json.loads(text), payload, received)
