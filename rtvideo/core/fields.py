"""JSON field checks shared by the message parsers (`protocol`, `interaction.parse`).

Pure. Every failure is a `ProtocolError` with the caller's code; the wording is part of the
protocol (clients and tests read it), so each message is written once, here.
"""

from __future__ import annotations

from typing import Any

from rtvideo.core.errors import ErrorCode, ProtocolError

MAX_EVENT_ID_CHARS = 256
#: prompts (start, interaction, negative) in characters: far above what a text encoder reads
#: (MiniLM 256 tokens, UMT5 512), far below what could stall an embedding or fill a cache
MAX_PROMPT_CHARS = 4096
MAX_TRANSITION_CHUNKS = 1000


def json_kind(value: Any) -> str:
    """What a JSON value is, as an error message names it."""
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


def short(value: int | float) -> str:
    """A number as an error message quotes it: a huge one is cut, its length said."""
    text = str(value)
    return text if len(text) <= 24 else text[:10] + "…" + f" ({len(text)} digits)"


def as_int(value: Any, name: str, low: int, high: int, code: ErrorCode) -> int:
    """A JSON integer (3.0 counts as 3; booleans, strings and 2.5 do not) within [low, high]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ProtocolError(code, f"{name} must be an integer, not {json_kind(value)}")
    if isinstance(value, float):
        if not value.is_integer():
            raise ProtocolError(code, f"{name} must be an integer, not {value!r}")
        value = int(value)
    if not low <= value <= high:
        raise ProtocolError(code, f"{name} must be between {low} and {high}, not {short(value)}")
    return value


def require_prompt(value: Any, name: str, code: ErrorCode) -> str:
    """A prompt: a string, not blank, within `MAX_PROMPT_CHARS`."""
    if not isinstance(value, str):
        raise ProtocolError(code, f"{name} must be a string, not {json_kind(value)}")
    if not value.strip():
        raise ProtocolError(code, f"{name} must not be empty")
    if len(value) > MAX_PROMPT_CHARS:
        raise ProtocolError(code, f"{name} is {len(value)} characters; the limit is {MAX_PROMPT_CHARS}")
    return value


#: a blend (`prompts`, start and interaction) takes 2 to 8 prompts, each weight in (0, MAX_BLEND_WEIGHT]
MIN_BLEND_PROMPTS = 2
MAX_BLEND_PROMPTS = 8
MAX_BLEND_WEIGHT = 1e6


def require_prompts(value: Any, name: str, code: ErrorCode) -> tuple[tuple[str, float], ...]:
    """A weighted blend: an array of 2–8 `{"text": prompt, "weight": number > 0}`, each text a
    prompt (`require_prompt`); returned as sent, weights not yet normalised."""
    if not isinstance(value, list):
        raise ProtocolError(code, f"{name} must be an array of {{text, weight}} objects, not {json_kind(value)}")
    if not MIN_BLEND_PROMPTS <= len(value) <= MAX_BLEND_PROMPTS:
        raise ProtocolError(
            code, f"{name} must hold {MIN_BLEND_PROMPTS} to {MAX_BLEND_PROMPTS} prompts, not {len(value)}"
        )
    out: list[tuple[str, float]] = []
    for i, item in enumerate(value):
        where = f"{name}[{i}]"
        if not isinstance(item, dict):
            raise ProtocolError(code, f"{where} must be an object {{text, weight}}, not {json_kind(item)}")
        extra = sorted(set(item) - {"text", "weight"})
        if extra:
            raise ProtocolError(code, f"{where} has unknown field(s): {', '.join(k[:40] for k in extra)}")
        if "text" not in item or "weight" not in item:
            raise ProtocolError(code, f"{where} needs both text and weight")
        text = require_prompt(item["text"], f"{where}.text", code)
        weight = item["weight"]
        if isinstance(weight, bool) or not isinstance(weight, (int, float)):
            raise ProtocolError(code, f"{where}.weight must be a number, not {json_kind(weight)}")
        if not 0 < weight <= MAX_BLEND_WEIGHT:
            raise ProtocolError(code, f"{where}.weight must be greater than 0 and at most {MAX_BLEND_WEIGHT:g}")
        out.append((text, float(weight)))
    return tuple(out)


def require_interpolation(value: Any, name: str, code: ErrorCode, allowed: tuple[str, ...]) -> str:
    """An interpolation method: one of `allowed` (`conditioning.INTERPOLATIONS`)."""
    if not isinstance(value, str) or value not in allowed:
        shown = repr(value[:40]) if isinstance(value, str) else json_kind(value)
        raise ProtocolError(code, f"{name} must be {' or '.join(map(repr, allowed))}, not {shown}")
    return value
