"""One line of a recording's event log (`events.jsonl`, docs/recordings.md): what it keeps of a
message, and its bytes.

Only what a replay or a branch reads is logged (`loggable`): pings, pongs and playback reports
are not, and an interaction or a stop keeps only the fields the protocol reads (a client's
padding is never written). Every `*_token` field is left out: a token is a key. Pure.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from rtvideo.core import protocol

#: inbound messages a replay or a branch reads, and the fields of each it reads (None: all)
REPLAYED_IN: dict[str, tuple[str, ...] | None] = {
    protocol.START: None,
    protocol.INTERACTION: ("type", "interaction"),
    protocol.STOP: ("type",),
}
#: outbound messages no replay reads (a pong echoes what its ping carried)
NOT_LOGGED_OUT = frozenset({"session.pong"})


def without_tokens(message: Mapping[str, Any]) -> dict[str, Any]:
    """The message with no `*_token` field (at its top level, where every token of the protocol
    is, and in `from_recording`, which carries one)."""
    out = {k: v for k, v in message.items() if not k.endswith("_token")}
    branch = out.get("from_recording")
    if isinstance(branch, Mapping):
        out["from_recording"] = without_tokens(branch)
    return out


def loggable(message: Mapping[str, Any], inbound: bool) -> dict[str, Any] | None:
    """What the event log keeps of a message (None: nothing): see the module docstring."""
    kind = message.get("type")
    if not inbound:
        return None if kind in NOT_LOGGED_OUT else without_tokens(message)
    if not isinstance(kind, str) or kind not in REPLAYED_IN:
        return None
    kept = REPLAYED_IN[kind]
    return without_tokens(message if kept is None else {k: message[k] for k in kept if k in message})


def encode(entry: dict[str, Any]) -> bytes:
    """A line as written: compact JSON and its newline."""
    return (json.dumps(entry, separators=(",", ":"), ensure_ascii=False) + "\n").encode("utf-8", "surrogatepass")
