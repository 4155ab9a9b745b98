"""The proxy's own acks (rtvideo.proxy.session.acks): the same decisions as the model, in lockstep with
it, taken on the session's one EventBook, and every acked event with exactly one end when an
interaction races the session's end."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.exceptions import ConnectionClosed

from rtvideo.core import protocol, server_messages
from rtvideo.core.event_book import EventBook
from rtvideo.proxy.frames import Frame
from rtvideo.proxy.session.acks import Answer, ProxyAcks
from rtvideo.proxy.session.ledger import Ledger
from rtvideo.triton.wire import START_TAG
from tests.support.fake_bridge import START, VIDEO_START, begin, ended, reply, settle
from tests.support.fake_bridge import run as run_unit
from tests.support.fake_bridge import session as unit_session
from tests.support.proxy_client import Ws, ws
from tests.support.proxy_host import run
from tests.support.recorder import Recorder
from tests.support.streams import check_stream_rules, event_ends

#: the session secret every request of these tests' sessions carries (docs/protocol.md §8)
SECRET = "unit-test-session-secret"


def interaction(event_id: str | None = "e1", prompt: str = "a lighthouse", **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"event": {"prompt": prompt}, **extra}
    if event_id is not None:
        body["event_id"] = event_id
    return {"type": "session.interaction", "interaction": body}


def decide(acks: ProxyAcks, message: dict[str, Any]) -> Any:
    return acks.decide(message, json.dumps(message).encode())


# --- the decisions -------------------------------------------------------------------------------
def test_a_valid_interaction_is_acked_here_and_its_retry_again() -> None:
    acks = ProxyAcks(Ledger())
    first = decide(acks, interaction("e1"))
    assert first is not None and first.event_id == "e1" and first.new
    assert json.loads(first.raw) == interaction("e1")  # forwarded as the client sent it
    again = decide(acks, interaction("e1"))
    assert again is not None and again.event_id == "e1" and not again.new


def test_what_only_the_model_may_answer_is_not_acked_nor_recorded() -> None:
    ledger = Ledger(EventBook(max_events=1))
    acks = ProxyAcks(ledger)
    assert decide(acks, interaction("e1", prompt="  ")) is None  # invalid_interaction
    assert decide(acks, interaction("e1", bogus=1)) is None
    assert len(ledger.book) == 0
    assert decide(acks, interaction("e1")) is not None
    assert decide(acks, interaction("e1", prompt="another")) is None  # event_id_conflict
    retry = decide(acks, interaction("e1"))
    assert retry is not None and not retry.new  # the original is untouched
    assert decide(acks, interaction("e2")) is None  # the session's limit (one event)
    ledger = Ledger()
    acks = ProxyAcks(ledger)
    ledger.taken(frame(server_messages.queued("r", "seen")))  # the model's ack for one the proxy left to it
    assert decide(acks, interaction("seen")) is None  # its payload is unknown here: the model judges a retry


def test_a_missing_event_id_is_generated_here_and_sent_on_to_the_model() -> None:
    acks = ProxyAcks(Ledger())
    message = interaction(None, transition_chunks=2)
    ack = decide(acks, message)
    assert ack is not None and ack.new and ack.event_id
    forwarded = json.loads(ack.raw)
    assert forwarded["interaction"]["event_id"] == ack.event_id
    forwarded["interaction"].pop("event_id")
    assert forwarded == message
    other = decide(acks, interaction(None, transition_chunks=2))
    assert other is not None and other.event_id != ack.event_id  # a fresh id each


def test_an_id_that_would_take_a_message_over_the_size_limit_is_left_to_the_model() -> None:
    ledger = Ledger()
    acks = ProxyAcks(ledger)
    message = interaction(None)  # an engine's modality (kept as sent) fills the message
    message["interaction"]["event"]["multi_modal_data"] = {"depth": {"data": ""}}
    filler = protocol.MAX_MESSAGE_BYTES - len(server_messages.encode(message)) - 30  # room for "mine", not a UUID
    message["interaction"]["event"]["multi_modal_data"]["depth"]["data"] = "x" * filler
    raw = server_messages.encode(message).encode()
    assert len(raw) <= protocol.MAX_MESSAGE_BYTES  # within the limit as sent, not with a UUID added
    assert acks.decide(message, raw) is None and len(ledger.book) == 0
    message["interaction"]["event_id"] = "mine"
    assert acks.decide(message, server_messages.encode(message).encode()) is not None  # as sent: acked here


def test_what_goes_on_is_the_parsed_interaction_never_the_clients_frame() -> None:
    """A field the parser ignores (a 100 kB pad beside `interaction`, a null prompt) is neither
    forwarded to the model nor stored: the ack carries the canonical frame, whose size is the
    parsed request's, and it parses back to the same request (a takeover rebuilds exactly)."""
    acks = ProxyAcks(Ledger())
    message = {**interaction("e1", transition_chunks=3), "pad": "x" * 100_000}
    message["interaction"]["event"]["prompts"] = None
    raw = server_messages.encode(message).encode()
    ack = acks.decide(message, raw)
    assert ack is not None and ack.new
    assert len(ack.raw) < 200 < len(raw) and b"pad" not in ack.raw and b"prompts" not in ack.raw
    assert json.loads(ack.raw) == {
        "type": "session.interaction",
        "interaction": {"event_id": "e1", "event": {"prompt": "a lighthouse"}, "transition_chunks": 3},
    }
    replica = ProxyAcks(Ledger())
    replica.restored(ack.raw)  # as a takeover reads it back: the same admission
    retry = replica.decide(message, raw)
    assert retry is not None and not retry.new and retry.raw == ack.raw


def frame(message: dict[str, Any], data: bytes | None = None) -> Frame:
    return Frame(server_messages.encode(message), message, data)


def test_an_event_the_model_never_admitted_is_in_its_done() -> None:
    """The model's done lists what its session admitted; the done the client gets has the
    proxy's book's lists, so an event acked here that the model refused is unapplied there."""
    ledger = Ledger()
    acks = ProxyAcks(ledger)
    for tag, event_id in (("m1", "shown"), ("m2", "listed"), ("m3", "late"), ("m4", "admitted")):
        ack = decide(acks, interaction(event_id))
        acks.forwarded(tag, ack)
        ledger.taken(frame(server_messages.queued("r", event_id)))  # its ack, handed to the socket
    assert acks.answered("m9", {"type": "session.pong"}) is Answer.NOT_ACKED_HERE
    assert acks.answered("m4", server_messages.queued("r", "admitted")) is Answer.ADMITTED
    meta = {
        "type": "video.chunk_metadata",
        "started_event_ids": ["shown", "admitted"],
        "completed_event_ids": ["shown"],
    }
    ledger.taken(frame(meta, b"x"))
    done = server_messages.done(
        "r", chunks=1, stopped=True, unapplied_event_ids=["listed"], unfinished_event_ids=["admitted"]
    )
    completed = ledger.taken(frame(done)).message
    assert completed["unapplied_event_ids"] == ["listed", "late"]
    assert completed["unfinished_event_ids"] == ["admitted"] and done["unapplied_event_ids"] == ["listed"]
    refused = server_messages.error(protocol.ErrorCode.INVALID_MESSAGE, "the session has ended", request_id="r")
    assert acks.answered("m3", refused) is Answer.REFUSED
    agreeing = {**done, "unapplied_event_ids": ["listed", "late"]}
    assert ledger.taken(same := frame(agreeing)) is same  # a done that lists every one already goes as sent


def test_a_done_names_no_event_whose_ack_never_reached_the_client() -> None:
    """Admitted here, its ack never handed out (the session ended first): the client never heard
    of it, so no done names it; the same holds for the done the proxy writes itself."""
    ledger = Ledger()
    acks = ProxyAcks(ledger)
    for event_id in ("told", "untold"):
        acks.forwarded(event_id, decide(acks, interaction(event_id)))
    ledger.taken(frame({"type": "video.start", "request_id": "r"}))
    ledger.taken(frame(server_messages.queued("r", "told")))
    model_done = server_messages.done(
        "r", chunks=0, stopped=False, unapplied_event_ids=["told", "untold"], unfinished_event_ids=[]
    )
    assert ledger.taken(frame(model_done)).message["unapplied_event_ids"] == ["told"]
    assert ledger.done() == server_messages.done(
        "r", chunks=0, stopped=False, unapplied_event_ids=["told"], unfinished_event_ids=[]
    )


# --- lockstep with the model ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def manager() -> Iterator[Any]:
    """The real model logic (SessionManager, built-in generator, rendering in-process)."""
    from rtvideo.backend.loading.assembly import build_manager
    from rtvideo.backend.loading.settings import BackendSettings

    built = build_manager(BackendSettings(width=64, height=64, render_workers=0, max_sessions=64), "realtime_video")
    yield built
    built.shutdown()


_sequences = iter(range(1, 1_000_000))

_messages = st.builds(
    lambda event_id, prompt, chunks, extra: interaction(
        event_id, prompt, **({"transition_chunks": chunks} if chunks != "absent" else {}), **extra
    ),
    st.sampled_from(["a", "b", "c", None]),
    st.sampled_from(["x", "y", " "]),  # " ": invalid (empty after stripping)
    st.sampled_from(["absent", None, 1, 2, 2.0, -1]),  # -1: invalid; 2 and 2.0: the same fingerprint
    st.sampled_from([{}, {}, {"bogus": 1}]),  # an unknown key: invalid
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_messages, min_size=1, max_size=15))
def test_the_proxy_acks_exactly_what_the_model_acks(manager: Any, messages: list[dict[str, Any]]) -> None:
    """Fed the same interactions in the same order, the model answers every one the proxy acked
    with that very ack, and every one the proxy left to it with an error."""
    corrid = next(_sequences)
    start = Recorder()
    manager.on_request(corrid, START.encode(), start=True, end=False, channel=start, secret=SECRET)
    request_id = start.sent[0][0]["request_id"]
    acks = ProxyAcks(Ledger())
    try:
        for message in messages:
            ack = decide(acks, message)
            answer = Recorder()
            manager.on_request(
                corrid,
                ack.raw if ack else json.dumps(message).encode(),
                start=False,
                end=False,
                channel=answer,
                secret=SECRET,
            )
            got = answer.sent[0][0]
            if ack is not None:
                assert got == server_messages.queued(request_id, ack.event_id)
            else:
                assert got["type"] == "error" and got["code"] in ("invalid_interaction", "event_id_conflict")
    finally:
        manager.on_request(
            corrid, b'{"type": "session.stop"}', start=False, end=True, channel=Recorder(), secret=SECRET
        )
    assert start.finished.wait(10)


# --- the session ---------------------------------------------------------------------------------
def test_an_ack_goes_out_before_the_model_answers_and_its_answer_is_dropped() -> None:
    async def body() -> list[dict[str, Any]]:
        s, conn, _bridge = unit_session()
        begin(s)
        s.steering.frame(
            s.owner, json.dumps(interaction("early")), False
        )  # before video.start: its ack waits behind it
        assert conn.texts() == []
        s.on_reply(VIDEO_START)
        s.steering.frame(s.owner, json.dumps(interaction("e1")), False)
        s.steering.frame(
            s.owner, json.dumps(interaction("e1", prompt="another")), False
        )  # a conflict: the model answers
        await settle()  # the writer hands them to the socket
        assert [m["type"] for m in conn.texts()] == [
            "video.start",
            "session.interaction.queued",
            "session.interaction.queued",
        ]
        s.on_reply(reply("m2", server_messages.queued("r", "early")))  # the model's identical acks: dropped
        s.on_reply(reply("m3", server_messages.queued("r", "e1")))
        s.on_reply(
            reply(
                "m4", server_messages.error(protocol.ErrorCode.EVENT_ID_CONFLICT, "used", request_id="r", event_id="e1")
            )
        )
        s.on_reply(reply(START_TAG, model_done))  # the model's end, listing both as the real one does
        await ended(s, conn)
        return conn.texts()

    model_done = server_messages.done(
        "r", chunks=0, stopped=False, unapplied_event_ids=["early", "e1"], unfinished_event_ids=[]
    )
    texts = run_unit(body())
    assert [(m["type"], m.get("event_id")) for m in texts] == [
        ("video.start", None),
        ("session.interaction.queued", "early"),
        ("session.interaction.queued", "e1"),
        ("error", "e1"),
        ("session.done", None),
    ]
    assert texts[1]["request_id"] == texts[2]["request_id"] == "r"
    assert texts[-1] == model_done  # the model admitted both: its done is passed on untouched


def test_an_interaction_that_raced_the_end_is_unapplied_in_the_done() -> None:
    """Acked here, refused by the model (its session had ended): not an error after its ack,
    but one end in session.done."""

    async def body() -> list[dict[str, Any]]:
        s, conn, _bridge = unit_session()
        begin(s)
        s.on_reply(VIDEO_START)
        s.steering.frame(s.owner, json.dumps(interaction("applied")), False)
        s.on_reply(reply("m2", server_messages.queued("r", "applied")))
        s.steering.frame(s.owner, json.dumps(interaction("late")), False)
        s.on_reply(
            reply(
                START_TAG,
                {
                    "type": "video.chunk_metadata",
                    "request_id": "r",
                    "kind": "media",
                    "transport_chunk_index": 0,
                    "started_event_ids": ["applied"],
                    "completed_event_ids": ["applied"],
                    "byte_length": 1,
                },
                b"x",
            )
        )
        s.on_reply(
            reply(
                START_TAG,
                server_messages.done("r", chunks=1, stopped=False, unapplied_event_ids=[], unfinished_event_ids=[]),
            )
        )
        s.on_reply(
            reply(
                "m3",
                {"type": "error", "code": "invalid_message", "message": "the session has ended", "request_id": "r"},
            )
        )
        await ended(s, conn)
        return conn.texts()

    texts = run_unit(body())
    assert [m["type"] for m in texts] == [
        "video.start",
        "session.interaction.queued",
        "session.interaction.queued",
        "video.chunk_metadata",
        "session.done",
    ]
    assert texts[-1]["unapplied_event_ids"] == ["late"] and texts[-1]["chunks"] == 1


def test_interactions_racing_the_end_through_triton_each_get_one_end(proxies) -> None:
    """Against the real model: short sessions with interactions sent until session.done. Every
    acked event ends exactly once, also the ones that reached the model after its session ended
    (counted by the proxy; sessions repeat until at least one did)."""
    limits = {"max_messages_per_second": 5000.0, "message_burst": 5000}
    url = proxies.url(**limits)
    registry = proxies.server(**limits).context.metrics.registry

    def refused() -> float:
        return registry.get_sample_value("rtvideo_proxy_acks_refused_total") or 0.0

    async def one(k: int) -> None:
        async with ws(url) as conn:
            s = Ws(conn)
            await s.start("a short one", num_frames=18)
            reader = asyncio.create_task(s.finish())
            n = 0
            with contextlib.suppress(ConnectionClosed):
                while not reader.done():
                    n += 1
                    await s.interact(f"update {n}", f"k{k}-{n}")
                    await asyncio.sleep(0.001)
            t = await reader
        check_stream_rules(t)
        # The proxy's bound on requests in flight to Triton and the model's 64 waiting events are
        # not what this test checks: a flood reaches them, a loaded machine sooner. An event past
        # the 64 is not acked here but sent to the model, which answers `interaction_queue_full`,
        # or, when the session ended there meanwhile, that it has ended. A refused interaction is
        # never acked, so it is in neither list below; any other error is a failure.
        errors = t.of_type("error")
        bounded = [m for m in errors if m["code"] == "rate_limited" and "in flight" in m["message"]]
        queue_full = [m for m in errors if m["code"] == "interaction_queue_full"]
        ended = [m for m in errors if m["code"] == "invalid_message" and m["message"] == "the session has ended"]
        assert len(bounded) + len(queue_full) + len(ended) == len(errors), errors
        acked = [m["event_id"] for m in t.of_type("session.interaction.queued")]
        ends = event_ends(t)
        assert sorted(ends) == sorted(acked), "each acked event reaches exactly one end"

    before = refused()
    for k in range(30):
        run(one(k))
        if refused() > before:
            break
    assert refused() > before, "no interaction raced a session's end in 30 sessions"
