"""The published JSON Schemas (rtvideo/schemas/) against the docs and the parser: every client
message in the docs validates, bad ones do not, and the schema agrees with the parser."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rtvideo.core import fields, protocol, server_messages, start_request
from rtvideo.core.chunks import media_metadata, trailer_metadata
from rtvideo.core.errors import ErrorCode, ProtocolError
from rtvideo.core.protocol import parse_message
from rtvideo.core.session_config import ModelCapabilities, resolve_session_config
from rtvideo.core.start_request import check_first_message, validate_start
from rtvideo.core.transitions import ChunkPlan
from tests.support.paths import REPO_ROOT
from tests.support.streams import check_server_message, schema_errors, schema_validator

ROOT = REPO_ROOT
#: every page that may show a client message: the protocol, the README and the other guides
DOCS = [
    ROOT / "docs" / "protocol.md",
    ROOT / "README.md",
    *sorted(set((ROOT / "docs").glob("*.md")) - {ROOT / "docs" / "protocol.md"}),
]


def client_valid(message: Any) -> bool:
    return not schema_errors(message, "client_messages")


def parser_accepts(message: dict[str, Any]) -> bool:
    """What the server's parser says of one decoded message (start first, the rest later)."""
    raw = json.dumps(message)
    try:
        if message.get("type") == protocol.START:
            validate_start(check_first_message(raw))
        else:
            parse_message(raw)
    except ProtocolError:
        return False
    return True


def doc_client_messages() -> list[tuple[str, dict[str, Any]]]:
    """Every client message written in the docs: ```json blocks and inline `{...}` spans."""
    found = []
    for path in DOCS:
        text = path.read_text()
        candidates = re.findall(r"```json\n(.*?)```", text, re.S) + re.findall(
            r"`(\{\"type\": \"session\.[^`]*\})`", text
        )
        for candidate in candidates:
            try:
                value = json.loads(candidate)
            except ValueError:
                continue  # an abridged server example ("…" outside a string)
            if isinstance(value, dict) and value.get("type") in protocol.CLIENT_TYPES:
                found.append((f"{path.name}: {candidate[:60]}", value))
    return found


DOC_MESSAGES = doc_client_messages()


def test_the_docs_show_every_client_message() -> None:
    assert {m["type"] for _, m in DOC_MESSAGES} == set(protocol.CLIENT_TYPES)
    assert len(DOC_MESSAGES) >= 6


@pytest.mark.parametrize("label,message", DOC_MESSAGES, ids=[label for label, _ in DOC_MESSAGES])
def test_client_messages_in_the_docs_validate(label: str, message: dict[str, Any]) -> None:
    assert schema_errors(message, "client_messages") == []
    # a branch's start is the proxy's to complete from its recording (docs/recordings.md)
    assert parser_accepts(message) or "from_recording" in message


GOOD = [
    {"type": "session.start", "prompt": "x"},
    {"type": "session.start", "prompt": "x", "size": "640X384", "seconds": "5", "format": None, "model": None},
    {"type": "session.start", "prompt": "x", "size": " 0064 x 4096 ", "seconds": 0.5, "seed": 2**63 - 1},
    {
        "type": "session.start",
        "prompt": "x",
        "guidance_scale": 1.0,
        "guidance_scale_2": 3,
        "boundary_ratio": 0.875,
        "flow_shift": 5.0,
        "true_cfg_scale": 4.0,
        "num_inference_steps": 4.0,
        "negative_prompt": "blur",
        "extra_params": {"anything": [1, {"goes": None}]},
    },
    {"type": "session.start", "sampling_params": {"prompt": "from sampling", "width": 64, "strength": 0.4}},
    {"type": "session.start", "prompt": "x", "width": None, "sampling_params": {"prompt": 5, "width": "shadowed"}},
    {"type": "session.interaction", "interaction": {"event": {"prompt": "a"}}, "ignored": True},
    {
        "type": "session.interaction",
        "interaction": {"event_id": None, "event": {"prompt": "a", "cache_salt": "s"}, "transition_chunks": None},
    },
    {"type": "session.stop", "reason": "ignored"},
    {"type": "session.ping"},
]

BAD = [
    {"prompt": "no type"},
    {"type": "session.bogus"},
    {"type": "session.start"},
    {"type": "session.start", "prompt": " \t\n"},
    {"type": "session.start", "prompt": "x" * (fields.MAX_PROMPT_CHARS + 1)},
    {"type": "session.start", "prompt": "x", "format": "webm"},
    {"type": "session.start", "prompt": "x", "colour": "red"},
    {"type": "session.start", "prompt": "x", "width": True},
    {"type": "session.start", "prompt": "x", "width": 2.5},
    {"type": "session.start", "prompt": "x", "fps": 121},
    {"type": "session.start", "prompt": "x", "seed": -1},
    {"type": "session.start", "prompt": "x", "seconds": 0},
    {"type": "session.start", "prompt": "x", "seconds": "2.5"},
    {"type": "session.start", "prompt": "x", "seconds": "0"},
    {"type": "session.start", "prompt": "x", "size": "4097x64"},
    {"type": "session.start", "prompt": "x", "size": "big"},
    {"type": "session.start", "prompt": "x", "size": "0000064x64"},
    {"type": "session.start", "prompt": "x", "guidance_scale": "1.0"},
    {"type": "session.start", "prompt": "x", "guidance_scale": -0.5},
    {"type": "session.start", "prompt": "x", "guidance_scale_2": 1e7},
    {"type": "session.start", "prompt": "x", "boundary_ratio": 1.5},
    {"type": "session.start", "prompt": "x", "flow_shift": -1},
    {"type": "session.start", "prompt": "x", "true_cfg_scale": False},
    {"type": "session.start", "prompt": "x", "num_inference_steps": 0},
    {"type": "session.start", "prompt": "x", "negative_prompt": 3},
    {"type": "session.start", "prompt": "x", "extra_params": []},
    {"type": "session.start", "prompt": "x", "sampling_params": {"width": "wide"}},
    {"type": "session.interaction"},
    {"type": "session.interaction", "interaction": {"event_id": "e"}},
    {"type": "session.interaction", "interaction": {"event": {"prompt": "a", "colour": "red"}}},
    {"type": "session.interaction", "interaction": {"event": {"prompt": "a"}, "transition_chunks": -1}},
    {"type": "session.interaction", "interaction": {"event": {"prompt": "a"}, "transition_chunks": "3"}},
    {"type": "session.interaction", "interaction": {"event_id": "", "event": {"prompt": "a"}}},
    {"type": "session.interaction", "interaction": {"event_id": "e" * 257, "event": {"prompt": "a"}}},
    {"type": "session.interaction", "interaction": {"event": {"prompt": "a"}, "extra": 1}},
]


@pytest.mark.parametrize("message", GOOD, ids=[json.dumps(m)[:50] for m in GOOD])
def test_good_client_messages_validate_and_parse(message: dict[str, Any]) -> None:
    assert schema_errors(message, "client_messages") == []
    # a branch's start is the proxy's to complete from its recording (docs/recordings.md)
    assert parser_accepts(message) or "from_recording" in message


@pytest.mark.parametrize("message", BAD, ids=[json.dumps(m)[:50] for m in BAD])
def test_bad_client_messages_fail_both(message: dict[str, Any]) -> None:
    assert schema_errors(message, "client_messages"), "the schema accepts what the server refuses"
    if "type" in message and message["type"] in protocol.CLIENT_TYPES:
        assert not parser_accepts(message)


values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 5000),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(["", " ", "x", "m4s", "webm", "64x64", "5", "2.5", "0", "a" * 300]),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(
        st.sampled_from(["prompt", "width", "seconds", "k"]), st.one_of(st.integers(-1, 64), st.just("p")), max_size=2
    ),
)


@settings(max_examples=500, deadline=None)
@given(st.dictionaries(st.sampled_from([*sorted(start_request.START_FIELDS - {"type"}), "other"]), values, max_size=6))
def test_schema_and_parser_agree_on_starts(fields: dict[str, Any]) -> None:
    message = {"type": "session.start", **fields}
    assert client_valid(message) == parser_accepts(message), message


@settings(max_examples=300, deadline=None)
@given(
    st.fixed_dictionaries(
        {},
        optional={
            "event_id": st.one_of(st.none(), st.integers(), st.text(max_size=3), st.just("e" * 257)),
            "event": st.one_of(
                st.integers(),
                st.dictionaries(
                    st.sampled_from(["prompt", "negative_prompt", "colour"]),
                    st.one_of(st.integers(), st.sampled_from(["", " ", "p"])),
                    max_size=3,
                ),
            ),
            "transition_chunks": st.one_of(
                st.none(), st.booleans(), st.integers(-2, 1002), st.floats(0, 3), st.just("3")
            ),
            "other": st.integers(),
        },
    )
)
def test_schema_and_parser_agree_on_interactions(interaction: dict[str, Any]) -> None:
    message = {"type": "session.interaction", "interaction": interaction}
    assert client_valid(message) == parser_accepts(message), message


def test_schemas_cover_the_protocol() -> None:
    client = schema_validator("client_messages").schema
    server = schema_validator("server_messages").schema
    assert set(client["properties"]["type"]["enum"]) == set(protocol.CLIENT_TYPES)
    start_fields = set(client["$defs"]["session.start"]["properties"])
    assert start_fields == set(start_request.START_FIELDS)
    assert set(server["$defs"]["error"]["properties"]["code"]["enum"]) == {c.value for c in ErrorCode}
    assert set(server["properties"]["type"]["enum"]) == {
        protocol.VIDEO_START,
        protocol.QUEUED,
        protocol.CHUNK_METADATA,
        protocol.PONG,
        protocol.STEERING_REVOKED,
        protocol.BROADCAST_ENDED,  # the proxy's answer to session.broadcast
        protocol.INTERACTION_SHARED,
        protocol.METRICS,
        protocol.DONE,
        protocol.ERROR,
    }


def test_server_message_builders_validate() -> None:
    rid = server_messages.new_request_id()
    caps = ModelCapabilities(
        model_names=("m",), width=64, height=64, fps=16, frames_per_chunk=9, default_transition_chunks=3
    )
    config = resolve_session_config(
        validate_start(
            check_first_message(
                json.dumps({"type": "session.start", "prompt": "p", "guidance_scale": 1.0, "extra_params": {"k": 1}})
            )
        ),
        caps,
    )
    plan = ChunkPlan(
        generation_chunk_index=0,
        mix={"p": 1.0},
        started=("e",),
        active=("e",),
        completed=(),
        superseded=(),
        interrupted=(),
        progress={"e": 1 / 3},
    )
    for message in (
        server_messages.video_start(rid, "m4s", config.to_json()),
        server_messages.queued(rid, "e"),
        server_messages.pong(),
        server_messages.steering_revoked(rid, 2),
        server_messages.interaction_shared(rid, "e", "steerer", {"event": {"prompt": "p"}, "transition_chunks": 2}),
        server_messages.done(rid, chunks=2, stopped=True, unapplied_event_ids=["a"], unfinished_event_ids=[]),
        server_messages.done(None, chunks=0, stopped=False, unapplied_event_ids=[], unfinished_event_ids=[]),
        server_messages.error(ErrorCode.INVALID_START, "m"),
        server_messages.error(ErrorCode.EVENT_ID_CONFLICT, "m", request_id=rid, event_id="e"),
        media_metadata(rid, 0, plan, 9, 100),
        trailer_metadata(rid, 1, 20),
    ):
        check_server_message(message)
    assert config.to_json()["ignored_fields"] == ["extra_params.k", "guidance_scale"]
    broken = [
        {**server_messages.video_start(rid, "m4s", config.to_json()), "extra": 1},
        server_messages.video_start("r1", "m4s", config.to_json()),
        {**server_messages.queued(rid, "e"), "event_id": ""},
        {**trailer_metadata(rid, 1, 20), "num_frames": 3},
        {**media_metadata(rid, 0, plan, 9, 100), "transition_progress": {"e": 2.0}},
        {"type": "error", "code": "oops", "message": "m"},
        {k: v for k, v in server_messages.video_start(rid, "m4s", config.to_json()).items() if k != "config"},
    ]
    for message in broken:
        assert schema_errors(message, "server_messages"), message
