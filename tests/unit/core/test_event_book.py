"""EventBook: the lifecycle of an event and the one definition of `session.done`'s lists.

Admission is the idempotency rule (docs/protocol.md §4): retries, conflicts, the bound,
and a model-based property test of first-payload-wins.
"""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rtvideo.core.errors import ErrorCode, ProtocolError
from rtvideo.core.event_book import EventBook, EventState, UnknownPayload
from rtvideo.core.transitions import TransitionTracker


def test_admission_is_the_idempotency_rule() -> None:
    book = EventBook(max_events=2)
    assert book.admit("a", b"1") is True
    assert book.admit("a", b"1") is False  # a retry: acked again, not applied
    with pytest.raises(ProtocolError) as conflict:
        book.admit("a", b"2")
    assert conflict.value.code is ErrorCode.EVENT_ID_CONFLICT and book.state("a") is EventState.ADMITTED
    assert book.admit("b", b"1") is True
    with pytest.raises(ProtocolError) as full:
        book.admit("c", b"1")
    assert full.value.code is ErrorCode.INTERACTION_HISTORY_FULL and "c" not in book


def test_new_retry_conflict() -> None:
    book = EventBook()
    assert book.admit("a", b"f1") is True
    assert book.admit("a", b"f1") is False
    with pytest.raises(ProtocolError) as info:
        book.admit("a", b"f2")
    assert info.value.code is ErrorCode.EVENT_ID_CONFLICT and info.value.event_id == "a"
    assert book.admit("a", b"f1") is False, "the original survives a conflict"
    assert len(book) == 1


def test_limit() -> None:
    book = EventBook(max_events=2)
    book.admit("a", b"x")
    book.admit("b", b"x")
    assert book.admit("a", b"x") is False, "retries still answer at the limit"
    with pytest.raises(ProtocolError) as info:
        book.admit("c", b"x")
    assert info.value.code is ErrorCode.INTERACTION_HISTORY_FULL


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abcd"), st.sampled_from([b"x", b"y", b"z"])), max_size=30))
def test_admission_matches_first_payload_model(ops) -> None:
    book, first = EventBook(), {}
    for event_id, fp in ops:
        expected = "new" if event_id not in first else ("retry" if first[event_id] == fp else "conflict")
        try:
            got = "new" if book.admit(event_id, fp) else "retry"
        except ProtocolError:
            got = "conflict"
        first.setdefault(event_id, fp)
        assert got == expected


def test_an_id_known_only_from_an_observed_ack_cannot_be_judged() -> None:
    book = EventBook()
    book.observe({"type": "session.interaction.queued", "request_id": "r", "event_id": "x"})
    assert book.state("x") is EventState.ACKED
    with pytest.raises(UnknownPayload):
        book.admit("x", b"1")


def test_each_event_reaches_one_end_and_keeps_it() -> None:
    book = EventBook()
    for event_id in "abcde":
        book.admit(event_id, b"p")
        book.acked(event_id)
    book.chunk(started=["a"])
    book.chunk(started=["b"], interrupted=["a"])
    book.chunk(superseded=["c"], started=["d"], completed=["d"])
    book.failed("e")
    book.chunk(started=["a", "c", "e"], completed=["a"])  # an end is final: nothing moves
    assert [book.state(e) for e in "abcde"] == [
        EventState.INTERRUPTED,
        EventState.STARTED,
        EventState.SUPERSEDED,
        EventState.COMPLETED,
        EventState.FAILED,
    ]
    assert book.done("r", chunks=4, stopped=True) == {
        "type": "session.done",
        "request_id": "r",
        "chunks": 4,
        "stopped": True,
        "unapplied_event_ids": [],
        "unfinished_event_ids": ["b"],
    }


def test_events_never_admitted_here_are_not_reported() -> None:
    book = EventBook()
    book.chunk(started=["ghost"])
    book.observe({"type": "error", "code": "interaction_failed", "event_id": "ghost2"})
    assert book.outcome().unapplied == () and book.outcome().unfinished == () and len(book) == 0


def test_an_unacked_admitted_event_is_unapplied_until_a_chunk_starts_it() -> None:
    book = EventBook()
    book.admit("a", b"p")  # its ack was not delivered, yet it is applied
    assert book.outcome().unapplied == ("a",)
    book.chunk(started=["a"])
    assert book.outcome().unfinished == ("a",)


def finish_rule_oracle(tracker: TransitionTracker) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """TEST ORACLE, not product code: the end-of-stream rule `TransitionTracker.finish()` had
    before `EventBook` replaced it. Unapplied: the targets dropped since the last chunk, then
    the pending one; unfinished: the one in flight. Read off the boundary a copy of the tracker
    would resolve next: the dropped ones are superseded there and the pending one starts; the
    one in flight is the active one that does not start."""
    boundary = copy.deepcopy(tracker).next_chunk()
    unfinished = tuple(e for e in boundary.active if e not in boundary.started)
    return (*boundary.superseded, *boundary.started), unfinished


_steps = st.lists(
    st.one_of(
        st.tuples(st.just("admit"), st.sampled_from(["p0", "p1", "p2"]), st.one_of(st.none(), st.integers(0, 3))),
        st.tuples(st.just("chunk")),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(_steps)
def test_the_lists_equal_what_the_transition_tracker_leaves_open(steps: list[tuple]) -> None:
    """Fed the tracker's sent chunk plans, the book leaves open exactly the events the
    tracker's own end-of-stream accounting did (the definition it replaces)."""
    tracker = TransitionTracker("start")
    book = EventBook()
    for n, step in enumerate(steps):
        if step[0] == "admit":
            event_id = f"e{n}"
            book.admit(event_id, step[1].encode())
            book.acked(event_id)
            tracker.admit(event_id, step[1], 2 if step[2] is None else step[2])  # the session's default N: 2
        else:
            plan = tracker.next_chunk()
            book.chunk(
                started=plan.started, completed=plan.completed, interrupted=plan.interrupted, superseded=plan.superseded
            )
    assert (book.outcome().unapplied, book.outcome().unfinished) == finish_rule_oracle(tracker)
