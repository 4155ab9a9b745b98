"""Recording ids: 128 random bits as 32 lowercase hex digits.

The id is the only name a client gives the store: anything else (`../`, a slash, another
alphabet, another length) is malformed and never reaches a path (`check`)."""

from __future__ import annotations

import re
import secrets

ID_PATTERN = re.compile(r"[0-9a-f]{32}")


class MalformedId(ValueError):
    """A name that cannot be a recording id (HTTP 400, `invalid_start`)."""


def new_id() -> str:
    return secrets.token_hex(16)


def check(value: object) -> str:
    """`value` when it is a well-formed id; MalformedId otherwise (what it was is not echoed
    past 64 characters: it is a client's text)."""
    if isinstance(value, str) and ID_PATTERN.fullmatch(value):
        return value
    shown = repr(value)[:64]
    raise MalformedId(f"{shown} is not a recording id (32 lowercase hex digits)")
