"""Client message validation table, start parsing, and server message shapes."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rtvideo.core import fields, server_messages, start_request
from rtvideo.core.errors import ErrorCode, ProtocolError
from rtvideo.core.interaction.types import InteractionRequest
from rtvideo.core.protocol import MAX_MESSAGE_BYTES, MAX_START_BYTES, PingRequest, StopRequest, parse_message
from rtvideo.core.start_request import check_first_message, validate_start


def inter(interaction=None, **extra) -> str:
    body = {"type": "session.interaction", **extra}
    if interaction is not None:
        body["interaction"] = interaction
    return json.dumps(body)


def ev(**event) -> dict:
    return {"event": event}


def deep(levels: int) -> str:
    return '{"type":"session.ping","x":' + "[" * levels + "]" * levels + "}"


J = ErrorCode.INVALID_JSON
M = ErrorCode.INVALID_MESSAGE
I = ErrorCode.INVALID_INTERACTION  # noqa: E741 - one letter like J and M, for the table below
BIG = ErrorCode.MESSAGE_TOO_LARGE

# (label, raw message, code, a fragment of the message a person reads)
BAD_MESSAGES = [
    ("empty", "", J, "not valid JSON"),
    ("garbage", "hello", J, "not valid JSON"),
    ("truncated", '{"type": "session.ping"', J, "not valid JSON"),
    ("bad utf-8", b'{"type":"session.ping","x":"\xff\xfe"}', J, "UTF-8"),
    ("NaN literal", '{"type":"session.ping","x":NaN}', J, "NaN"),
    ("Infinity literal", '{"type":"session.ping","x":Infinity}', J, "Infinity"),
    (
        "huge float",
        '{"type":"session.interaction","interaction":{"event":{"prompt":"x"},"transition_chunks":1e999}}',
        J,
        "out of range",
    ),
    ("5000-digit int", '{"type":"session.ping","x":' + "9" * 5000 + "}", J, "not valid JSON"),
    ("deep nesting 40", deep(40), J, "nested deeper"),
    ("deep nesting 20000", deep(20000), J, "nested deeper"),
    ("oversized", json.dumps({"type": "session.ping", "pad": "x" * MAX_MESSAGE_BYTES}), BIG, "limit is"),
    ("array", "[]", M, "not an array"),
    ("string", '"session.ping"', M, "not a string"),
    ("number", "42", M, "not a number"),
    ("null", "null", M, "not null"),
    ("boolean", "true", M, "not a boolean"),
    ("missing type", "{}", M, "no 'type'"),
    ("unknown type", '{"type":"session.pause"}', M, "unknown message type"),
    ("type not string", '{"type":7}', M, "unknown message type"),
    ("second start", '{"type":"session.start","prompt":"x"}', M, "already started"),
    ("no interaction", inter(), I, "interaction must be an object"),
    (
        "interaction null",
        json.dumps({"type": "session.interaction", "interaction": None}),
        I,
        "interaction must be an object",
    ),
    ("interaction string", inter("go"), I, "not a string"),
    ("interaction array", inter([]), I, "not an array"),
    ("no event", inter({"event_id": "e"}), I, "event must be an object"),
    ("event string", inter({"event": "a cat"}), I, "event must be an object"),
    ("event null", inter({"event": None}), I, "event must be an object"),
    ("no prompt", inter(ev()), I, "prompt is required"),
    ("prompt null", inter(ev(prompt=None)), I, "must be a string"),
    ("prompt number", inter(ev(prompt=5)), I, "must be a string"),
    ("prompt list", inter(ev(prompt=["a"])), I, "must be a string"),
    ("empty prompt", inter(ev(prompt="")), I, "must not be empty"),
    ("whitespace prompt", inter(ev(prompt=" \t\n ")), I, "must not be empty"),
    ("unknown event key", inter(ev(prompt="x", style="noir")), I, "unknown event field(s): style"),
    ("unknown interaction key", inter({"event": {"prompt": "x"}, "priority": 1}), I, "priority"),
    ("event_id number", inter({"event": {"prompt": "x"}, "event_id": 7}), I, "event_id must be"),
    ("event_id empty", inter({"event": {"prompt": "x"}, "event_id": ""}), I, "event_id must be"),
    ("event_id object", inter({"event": {"prompt": "x"}, "event_id": {}}), I, "event_id must be"),
    ("event_id too long", inter({"event": {"prompt": "x"}, "event_id": "e" * 257}), I, "256"),
    ("chunks true", inter({"event": {"prompt": "x"}, "transition_chunks": True}), I, "not a boolean"),
    ("chunks false", inter({"event": {"prompt": "x"}, "transition_chunks": False}), I, "not a boolean"),
    ("chunks 2.5", inter({"event": {"prompt": "x"}, "transition_chunks": 2.5}), I, "2.5"),
    ("chunks -1", inter({"event": {"prompt": "x"}, "transition_chunks": -1}), I, "between 0"),
    ("chunks string", inter({"event": {"prompt": "x"}, "transition_chunks": "3"}), I, "not a string"),
    ("chunks list", inter({"event": {"prompt": "x"}, "transition_chunks": [3]}), I, "not an array"),
    ("chunks huge int", inter({"event": {"prompt": "x"}, "transition_chunks": 10**30}), I, "digits"),
    ("chunks huge float", inter({"event": {"prompt": "x"}, "transition_chunks": 1e300}), I, "between 0"),
]


@pytest.mark.parametrize("label,raw,code,fragment", BAD_MESSAGES, ids=[b[0] for b in BAD_MESSAGES])
def test_bad_message(label: str, raw, code: ErrorCode, fragment: str) -> None:
    with pytest.raises(ProtocolError) as info:
        parse_message(raw)
    assert info.value.code is code
    assert fragment in info.value.message
    assert len(info.value.message) < 300


def test_table_is_big_enough() -> None:
    assert len(BAD_MESSAGES) >= 40


def test_event_id_reported_when_known() -> None:
    with pytest.raises(ProtocolError) as info:
        parse_message(inter({"event_id": "e1", "event": {"prompt": " "}}))
    assert info.value.event_id == "e1"


def test_valid_interaction_forms() -> None:
    msg = parse_message(inter({"event_id": "ui-1", "event": {"prompt": " snow "}, "transition_chunks": 3.0}))
    assert msg == InteractionRequest(event={"prompt": " snow "}, event_id="ui-1", transition_chunks=3)
    bare = parse_message(inter({"event": {"prompt": "rain"}, "event_id": None, "transition_chunks": None}))
    assert bare.event_id is None and bare.transition_chunks is None
    assigned = bare.with_event_id()
    assert assigned.event_id and len(assigned.event_id) == 36
    assert assigned.fingerprint == bare.fingerprint
    extra_fields = parse_message(inter({"event": {"prompt": "a", "negative_prompt": "b"}}))
    assert extra_fields.event == {"prompt": "a", "negative_prompt": "b"}
    assert isinstance(parse_message('{"type":"session.stop"}'), StopRequest)
    assert isinstance(parse_message(b'{"type":"session.ping"}'), PingRequest)


def test_fingerprint_is_canonical() -> None:
    a = InteractionRequest(event={"prompt": "x", "negative_prompt": "y"}, event_id="1", transition_chunks=2)
    b = InteractionRequest(event={"negative_prompt": "y", "prompt": "x"}, event_id="2", transition_chunks=2)
    c = InteractionRequest(event={"prompt": "x", "negative_prompt": "y"}, event_id="1", transition_chunks=None)
    assert a.fingerprint == b.fingerprint != c.fingerprint


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.binary(max_size=200),
        st.text(max_size=200),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
            lambda children: (
                st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
            ),
            max_leaves=20,
        ).map(lambda v: json.dumps({"type": "session.interaction", "interaction": v})),
    )
)
def test_never_raises_anything_else(raw) -> None:
    for parse in (parse_message, lambda raw: validate_start(check_first_message(raw))):
        try:
            parse(raw)
        except ProtocolError as exc:
            assert isinstance(exc.code, ErrorCode) and exc.message


# --- session.start ------------------------------------------------------------------------
def start(**fields) -> str:
    return json.dumps({"type": "session.start", **fields})


BAD_STARTS = [
    ("not json", "{", ErrorCode.INVALID_START, "not valid JSON"),
    ("not object", "[1]", ErrorCode.INVALID_START, "JSON object"),
    ("interaction first", inter(ev(prompt="x")), ErrorCode.INVALID_START, "must be session.start"),
    ("ping first", '{"type":"session.ping"}', ErrorCode.INVALID_START, "must be session.start"),
    ("no prompt", start(), ErrorCode.INVALID_START, "needs a prompt"),
    ("empty prompt", start(prompt="  "), ErrorCode.INVALID_START, "must not be empty"),
    ("format webm", start(prompt="x", format="webm"), ErrorCode.UNSUPPORTED_FORMAT, "'webm'"),
    ("format number", start(prompt="x", format=1), ErrorCode.INVALID_START, "format must be a string"),
    ("width bool", start(prompt="x", width=True), ErrorCode.INVALID_START, "width must be an integer"),
    ("width zero", start(prompt="x", width=0), ErrorCode.INVALID_START, "between 1"),
    ("fps 2.5", start(prompt="x", fps=2.5), ErrorCode.INVALID_START, "2.5"),
    ("seed negative", start(prompt="x", seed=-1), ErrorCode.INVALID_START, "seed"),
    ("size bad", start(prompt="x", size="big"), ErrorCode.INVALID_START, "WIDTHxHEIGHT"),
    ("seconds zero", start(prompt="x", seconds=0), ErrorCode.INVALID_START, "greater than 0"),
    ("unknown field", start(prompt="x", colour="red"), ErrorCode.INVALID_START, "colour"),
    ("extra_params list", start(prompt="x", extra_params=[]), ErrorCode.INVALID_START, "extra_params"),
    ("sampling_params str", start(prompt="x", sampling_params="a"), ErrorCode.INVALID_START, "sampling_params"),
    ("oversized", start(prompt="x" * MAX_START_BYTES), ErrorCode.MESSAGE_TOO_LARGE, "limit is"),
    ("size superscript digit", start(prompt="x", size="2\u00b2x64"), ErrorCode.INVALID_START, "WIDTHxHEIGHT"),
    ("size 5000 digits", start(prompt="x", size="9" * 5000 + "x2"), ErrorCode.INVALID_START, "WIDTHxHEIGHT"),
    (
        "extra_params string with sampling",
        start(prompt="x", extra_params="ab", sampling_params={}),
        ErrorCode.INVALID_START,
        "extra_params must be an object",
    ),
    ("sampling_params list", start(prompt="x", sampling_params=[1]), ErrorCode.INVALID_START, "sampling_params"),
]


@pytest.mark.parametrize("label,raw,code,fragment", BAD_STARTS, ids=[b[0] for b in BAD_STARTS])
def test_bad_start(label: str, raw: str, code: ErrorCode, fragment: str) -> None:
    with pytest.raises(ProtocolError) as info:
        validate_start(check_first_message(raw))
    assert info.value.code is code
    assert fragment in info.value.message


def test_start_fields() -> None:
    req = validate_start(
        check_first_message(
            start(
                prompt="harbour",
                size="320x240",
                width=64,
                fps=16.0,
                seconds=2.5,
                seed=7,
                sampling_params={"num_frames": 20, "strength": 0.4},
            )
        )
    )
    assert (req.width, req.height, req.fps, req.seed, req.seconds) == (320, 240, 16, 7, 2.5)
    assert req.num_frames == 20 and req.extra_params == {"strength": 0.4}
    assert req.format == "m4s"
    plain = validate_start(check_first_message(start(prompt="harbour", width=256, num_frames=144)))
    assert plain.width == 256 and plain.height is None and plain.num_frames == 144


# --- server messages ------------------------------------------------------------------------
def test_server_messages() -> None:
    rid = server_messages.new_request_id()
    assert rid.startswith("video_stream-") and len(rid) == len("video_stream-") + 32
    assert server_messages.queued(rid, "e") == {
        "type": "session.interaction.queued",
        "request_id": rid,
        "event_id": "e",
    }
    assert server_messages.pong() == {"type": "session.pong"}
    done = server_messages.done(rid, chunks=3, stopped=True, unapplied_event_ids=["a"], unfinished_event_ids=[])
    assert done["type"] == "session.done" and done["chunks"] == 3 and done["stopped"] is True
    err = server_messages.error(ErrorCode.EVENT_ID_CONFLICT, "m", request_id=rid, event_id="e")
    assert err == {"type": "error", "code": "event_id_conflict", "message": "m", "request_id": rid, "event_id": "e"}
    assert "request_id" not in server_messages.error(ErrorCode.INVALID_START, "m")
    assert json.loads(server_messages.encode(server_messages.video_start(rid, "m4s", {"width": 1})))["config"] == {
        "width": 1
    }


start_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False),
    st.text(max_size=12),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=6), st.integers(), max_size=3),
)


@settings(max_examples=400, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from([*sorted(start_request.START_FIELDS - {"type"}), "other"]), start_values, max_size=8
    )
)
def test_start_validation_never_raises_anything_else(fields: dict) -> None:
    try:
        validate_start(check_first_message(json.dumps({"type": "session.start", **fields})))
    except ProtocolError as exc:
        assert isinstance(exc.code, ErrorCode) and exc.message


# --- hostile text (lone surrogates, huge prompts) --------------------------------------------
SURROGATE_MESSAGES = [
    ("event_id", r'{"type":"session.interaction","interaction":{"event_id":"\ud800","event":{"prompt":"a"}}}'),
    ("prompt", r'{"type":"session.interaction","interaction":{"event":{"prompt":"a\udfffb"}}}'),
    ("key", r'{"type":"session.ping","\udc00":1}'),
    (
        "nested",
        r'{"type":"session.interaction","interaction":{"event":{"prompt":"a","additional_information":{"x":["\ud83d"]}}}}',
    ),
]


@pytest.mark.parametrize("label,raw", SURROGATE_MESSAGES, ids=[m[0] for m in SURROGATE_MESSAGES])
def test_lone_surrogates_are_invalid_json(label: str, raw: str) -> None:
    json.loads(raw)  # valid JSON ...
    with pytest.raises(ProtocolError) as info:
        parse_message(raw)  # ... but not text anything could send on
    assert info.value.code is ErrorCode.INVALID_JSON and "surrogate" in info.value.message


def test_lone_surrogate_in_start_is_invalid_start_and_pairs_pass() -> None:
    with pytest.raises(ProtocolError) as info:
        validate_start(check_first_message(r'{"type":"session.start","prompt":"\ud800"}'))
    assert info.value.code is ErrorCode.INVALID_START and "surrogate" in info.value.message
    assert (
        validate_start(check_first_message(r'{"type":"session.start","prompt":"smile \ud83d\ude00"}')).prompt
        == "smile \U0001f600"
    )


def test_accepted_text_always_encodes_as_utf8() -> None:
    """Whatever the core accepts, the model can send back (the ack quotes the event id)."""
    req = parse_message(
        r'{"type":"session.interaction","interaction":{"event_id":"\u00e9\ud83d\ude00\u2028","event":{"prompt":"a"}}}'
    )
    assert isinstance(req, InteractionRequest)
    server_messages.encode(server_messages.queued("r", req.event_id)).encode("utf-8")


def test_prompt_length_is_capped() -> None:
    long = "x" * (fields.MAX_PROMPT_CHARS + 1)
    with pytest.raises(ProtocolError) as info:
        validate_start(check_first_message(start(prompt=long)))
    assert info.value.code is ErrorCode.INVALID_START and str(fields.MAX_PROMPT_CHARS) in info.value.message
    with pytest.raises(ProtocolError) as info:
        parse_message(
            json.dumps({"type": "session.interaction", "interaction": {"event_id": "e", "event": {"prompt": long}}})
        )
    assert info.value.code is ErrorCode.INVALID_INTERACTION and info.value.event_id == "e"
    assert validate_start(check_first_message(start(prompt="y" * fields.MAX_PROMPT_CHARS))).prompt


def test_fingerprint_is_a_fixed_size_digest() -> None:
    small = InteractionRequest(event={"prompt": "a"}, event_id="e")
    big = InteractionRequest(event={"prompt": "b" * fields.MAX_PROMPT_CHARS}, event_id="e")
    assert len(small.fingerprint) == len(big.fingerprint) == 32
    assert small.fingerprint != big.fingerprint
