"""A `rate_limited` answer names the interaction it refused (docs/protocol.md §3.4): its
`event_id`, read only from a bounded text frame that parses; never from anything else."""

from __future__ import annotations

import json
from typing import Any

import pytest

from rtvideo.core import fields, protocol
from rtvideo.proxy.limits import STOP_PEEK_BYTES, event_id_in, over_rate_stop, refused_event_id
from tests.support.fake_bridge import VIDEO_START, begin, ended, run, session


def interaction(event_id: Any = "e1", **extra: Any) -> dict[str, Any]:
    return {"type": "session.interaction", "interaction": {"event_id": event_id, "event": {"prompt": "p"}}, **extra}


@pytest.mark.parametrize(
    ("frame", "binary", "expected"),
    [
        (json.dumps(interaction("e1")), False, "e1"),
        (json.dumps(interaction("e1")).encode(), False, "e1"),  # a text frame handed over as bytes
        (json.dumps(interaction("x" * fields.MAX_EVENT_ID_CHARS)), False, "x" * fields.MAX_EVENT_ID_CHARS),
        (json.dumps(interaction("e1")).encode(), True, None),  # a binary frame is never read
        ('{"type": "session.interaction", "interaction": {"event_id": "e1"', False, None),  # not JSON
        (json.dumps(interaction("e1", pad="x" * protocol.MAX_MESSAGE_BYTES)), False, None),  # over the limit
        (json.dumps(interaction(7)), False, None),  # not a string
        (json.dumps(interaction("")), False, None),
        (json.dumps(interaction("x" * (fields.MAX_EVENT_ID_CHARS + 1))), False, None),  # no server message names it
        (json.dumps({"type": "session.ping", "event_id": "e1"}), False, None),  # not an interaction
        (json.dumps({"type": "session.interaction", "interaction": {"event": {"event_id": "e1"}}}), False, None),
        (json.dumps({"type": "session.interaction", "interaction": ["event_id"]}), False, None),
        (json.dumps({"type": "session.start", "interaction": {"event_id": "e1"}}), False, None),  # refused later
    ],
)
def test_the_event_id_of_a_refused_frame(frame: str | bytes, binary: bool, expected: str | None) -> None:
    assert refused_event_id(frame, binary) == expected


def test_the_event_id_of_a_decoded_message() -> None:
    assert event_id_in(interaction("e1")) == "e1"
    assert event_id_in({"type": "session.interaction", "interaction": {"event": {"prompt": "p"}}}) is None
    assert event_id_in({"type": "session.stop"}) is None


def test_a_stop_over_the_rate_is_a_small_text_stop() -> None:
    stop = json.dumps({"type": "session.stop"})
    assert over_rate_stop(stop, False) and over_rate_stop(stop.encode(), False)
    assert not over_rate_stop(stop.encode(), True)
    padded = json.dumps({"type": "session.stop", "pad": "x" * STOP_PEEK_BYTES})
    assert protocol.is_stop(padded) and not over_rate_stop(padded, False)  # a stop, but not peeked at
    assert not over_rate_stop(json.dumps({"type": "session.ping", "note": "session.stop"}), False)
    assert not over_rate_stop('{"type": "session.stop"', False)


def test_rate_limited_answers_name_the_refused_interaction() -> None:
    """Over the message rate and over the bound on requests in flight alike; frames without a
    readable event id are answered without one."""

    async def body() -> list[dict[str, Any]]:
        s, conn, _ = session(max_messages_per_second=0.01, message_burst=3, max_requests_in_flight=1)
        begin(s)
        s.on_reply(VIDEO_START)
        s.steering.frame(s.owner, json.dumps(interaction("first")), False)  # within the rate: acked, in flight
        s.steering.frame(s.owner, json.dumps(interaction("second")), False)  # within the rate, over the bound in flight
        s.steering.frame(s.owner, json.dumps({"type": "session.ping"}), False)  # the last token
        s.steering.frame(s.owner, json.dumps(interaction("third")), False)  # over the rate
        s.steering.frame(s.owner, json.dumps(interaction(3)), False)
        s.steering.frame(s.owner, '{"type": "session.interaction", "interaction": {"event_id": "fourth"', False)
        s.steering.frame(s.owner, json.dumps(interaction("e", pad="x" * protocol.MAX_MESSAGE_BYTES)), False)
        s.steering.frame(s.owner, json.dumps(interaction("fifth")).encode(), True)
        s.steering.frame(s.owner, json.dumps({"type": "session.stop"}), False)
        await ended(s, conn)
        return conn.texts()

    texts = run(body())
    answers = [(m["type"], m.get("code"), m.get("event_id")) for m in texts[1:-1]]
    assert answers == [
        ("session.interaction.queued", None, "first"),
        ("error", "rate_limited", "second"),
        ("session.pong", None, None),
        ("error", "rate_limited", "third"),
        ("error", "rate_limited", None),
        ("error", "rate_limited", None),
        ("error", "rate_limited", None),
        ("error", "rate_limited", None),
    ]
    assert "in flight" in texts[2]["message"] and "over the rate" in texts[4]["message"]
    assert all(m.get("request_id") == "r" for m in texts[1:-1] if m["type"] == "error")
