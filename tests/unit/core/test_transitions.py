"""Transition tracker: golden traces, properties, and equality with an independent reference.

What is still open when the stream ends is read the way the session reads it: an
`EventBook` fed with the admitted events and the plans' lists.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rtvideo.core.event_book import EventBook, Outcome
from rtvideo.core.transitions import ChunkPlan, TransitionTracker
from tests.support.session_configs import session_config

VALUES = {"src": 0.0, "A": 1.0, "B": 10.0}


class Booked:
    """A tracker and the event book a session keeps beside it (every plan counted as sent)."""

    def __init__(self, default_n: int) -> None:
        self.config = session_config(default_transition_chunks=default_n)
        self.tracker = TransitionTracker("src")
        self.book = EventBook()

    def admit(self, event_id: str, prompt: str, n: int | None = None) -> None:
        self.book.admit(event_id, prompt.encode())
        self.book.acked(event_id)
        self.tracker.admit(event_id, prompt, self.config.transition_chunks(n))

    def next_chunk(self) -> ChunkPlan:
        plan = self.tracker.next_chunk()
        self.book.chunk(
            started=plan.started, completed=plan.completed, interrupted=plan.interrupted, superseded=plan.superseded
        )
        return plan

    def finish(self) -> Outcome:
        return self.book.outcome()


def value(plan: ChunkPlan) -> float:
    return sum(weight * VALUES[key] for key, weight in plan.mix.items())


def ids(plan: ChunkPlan) -> dict[str, tuple[str, ...]]:
    """The plan's event lists."""
    return {key: getattr(plan, key) for key in ("started", "active", "completed", "superseded", "interrupted")}


def lists(started=(), active=(), completed=(), superseded=(), interrupted=()):
    return {
        "started": tuple(started),
        "active": tuple(active),
        "completed": tuple(completed),
        "superseded": tuple(superseded),
        "interrupted": tuple(interrupted),
    }


@pytest.mark.parametrize("n", [0, 1])
def test_golden_hard_update(n: int) -> None:
    tracker = Booked(3)
    tracker.admit("A", "A", n)
    plan = tracker.next_chunk()
    assert value(plan) == 1.0
    assert ids(plan) == lists(["A"], ["A"], ["A"])
    assert plan.progress == {"A": 1.0}
    after = tracker.next_chunk()
    assert value(after) == 1.0 and ids(after) == lists()
    assert tracker.finish().unapplied == () and tracker.finish().unfinished == ()


def test_golden_default_three_chunks() -> None:
    tracker = Booked(3)
    tracker.admit("A", "A")  # default N
    p1, p2, p3, p4 = (tracker.next_chunk() for _ in range(4))
    assert [value(p) for p in (p1, p2, p3)] == pytest.approx([1 / 3, 2 / 3, 1.0])
    assert ids(p1) == lists(["A"], ["A"])
    assert ids(p2) == lists([], ["A"])
    assert ids(p3) == lists([], ["A"], ["A"])
    assert [p.progress for p in (p1, p2, p3)] == [{"A": 1 / 3}, {"A": 2 / 3}, {"A": 1.0}]
    assert ids(p4) == lists() and value(p4) == 1.0


def test_golden_interrupt() -> None:
    tracker = Booked(3)
    tracker.admit("A", "A", 3)
    p1 = tracker.next_chunk()
    tracker.admit("B", "B", 2)
    p2, p3 = tracker.next_chunk(), tracker.next_chunk()
    assert value(p1) == pytest.approx(1 / 3)
    assert value(p2) == pytest.approx(16 / 3)
    assert value(p3) == 10.0
    assert ids(p1) == lists(["A"], ["A"])
    assert ids(p2) == lists(["B"], ["A", "B"], interrupted=["A"])
    assert p2.progress == {"A": 2 / 3, "B": 0.5}
    assert ids(p3) == lists([], ["B"], ["B"])


def test_golden_overlap_completes_first() -> None:
    tracker = Booked(3)
    tracker.admit("A", "A", 2)
    p1 = tracker.next_chunk()
    tracker.admit("B", "B", 2)
    p2, p3 = tracker.next_chunk(), tracker.next_chunk()
    assert [value(p) for p in (p1, p2, p3)] == pytest.approx([0.5, 5.5, 10.0])
    assert ids(p1) == lists(["A"], ["A"])
    assert ids(p2) == lists(["B"], ["A", "B"], ["A"])
    assert ids(p3) == lists([], ["B"], ["B"])


def test_golden_supersede_before_start() -> None:
    tracker = Booked(3)
    tracker.admit("A", "A")
    tracker.admit("B", "B", 0)
    p1 = tracker.next_chunk()
    assert value(p1) == 10.0
    assert ids(p1) == lists(["B"], ["B"], ["B"], superseded=["A"])
    assert ids(tracker.next_chunk()) == lists()


def test_boundary_before_chunk_zero_is_eligible_and_indices_count() -> None:
    tracker = Booked(0)
    tracker.admit("A", "A")
    plans = [tracker.next_chunk() for _ in range(3)]
    assert [p.generation_chunk_index for p in plans] == [0, 1, 2]
    assert plans[0].started == ("A",)


def test_finish_reports_pending_and_unfinished() -> None:
    tracker = Booked(3)
    tracker.admit("A", "A")
    tracker.next_chunk()
    tracker.admit("B", "B")
    tracker.admit("C", "C")
    outcome = tracker.finish()
    assert outcome.unapplied == ("B", "C")
    assert outcome.unfinished == ("A",)


def test_negative_chunks_rejected() -> None:
    # a negative default is refused by the model's settings (tests/unit/backend/test_session_runtime.py)
    with pytest.raises(ValueError):
        TransitionTracker("src").admit("A", "A", -2)


# --- independent reference: a direct transcription of docs/protocol.md §5 over scalar states ----
@dataclass
class RefFlight:
    eid: str
    src: dict
    tgt: str
    n: int
    k: int


def reference(initial: str, default_n: int, steps: list) -> tuple[list[dict], dict]:
    """steps: ('admit', eid, prompt, n|None) or ('chunk',). Returns per-chunk dicts and the end."""
    state = {initial: 1.0}
    flight = None
    pending = None
    dropped: list[str] = []
    out = []
    for step in steps:
        if step[0] == "admit":
            _, eid, prompt, n = step
            if pending is not None:
                dropped.append(pending[0])
            pending = (eid, prompt, default_n if n is None else n)
            continue
        rec = {"started": [], "active": [], "completed": [], "interrupted": [], "progress": {}}
        if flight is not None:
            flight.k += 1
            alpha = flight.k / flight.n
            rec["active"].append(flight.eid)
            rec["progress"][flight.eid] = alpha
            if alpha >= 1:
                state = {flight.tgt: 1.0}
                rec["completed"].append(flight.eid)
                flight = None
            else:
                state = lerp(flight.src, flight.tgt, alpha)
        if pending is not None:
            eid, prompt, n = pending
            pending = None
            if flight is not None:
                rec["interrupted"].append(flight.eid)
                flight = None
            rec["started"].append(eid)
            rec["active"].append(eid)
            if n == 0:
                state = {prompt: 1.0}
                rec["progress"][eid] = 1.0
                rec["completed"].append(eid)
            else:
                alpha = 1 / n
                rec["progress"][eid] = alpha
                if alpha >= 1:
                    state = {prompt: 1.0}
                    rec["completed"].append(eid)
                else:
                    flight = RefFlight(eid, dict(state), prompt, n, 1)
                    state = lerp(flight.src, prompt, alpha)
        rec["superseded"] = dropped
        dropped = []
        rec["mix"] = state
        out.append(rec)
    end = {
        "unapplied": dropped + ([pending[0]] if pending else []),
        "unfinished": [flight.eid] if flight else [],
    }
    return out, end


def lerp(src: dict, tgt: str, alpha: float) -> dict:
    mix = {key: (1 - alpha) * w for key, w in src.items()}
    mix[tgt] = mix.get(tgt, 0.0) + alpha
    return {k: w for k, w in mix.items() if w > 0}


PROMPTS = ["src", "A", "B", "C"]
admit_step = st.tuples(st.just("admit"), st.sampled_from(PROMPTS), st.one_of(st.none(), st.integers(0, 6)))
steps_strategy = st.lists(st.one_of(admit_step, st.just(("chunk",))), max_size=40)


def run_both(default_n: int, raw_steps: list):
    tracker = Booked(default_n)
    steps, plans = [], []
    counter = 0
    for step in raw_steps:
        if step[0] == "admit":
            eid = f"e{counter}"
            counter += 1
            tracker.admit(eid, step[1], step[2])
            steps.append(("admit", eid, step[1], step[2]))
        else:
            plans.append(tracker.next_chunk())
            steps.append(("chunk",))
    return tracker, plans, steps, counter


@settings(max_examples=400, deadline=None)
@given(default_n=st.integers(0, 6), raw_steps=steps_strategy)
def test_matches_reference(default_n: int, raw_steps: list) -> None:
    tracker, plans, steps, _ = run_both(default_n, raw_steps)
    ref_chunks, ref_end = reference("src", default_n, steps)
    assert len(plans) == len(ref_chunks)
    for plan, ref in zip(plans, ref_chunks, strict=True):
        assert list(plan.started) == ref["started"]
        assert list(plan.active) == ref["active"]
        assert list(plan.completed) == ref["completed"]
        assert list(plan.superseded) == ref["superseded"]
        assert list(plan.interrupted) == ref["interrupted"]
        assert plan.progress.keys() == ref["progress"].keys()
        for key in plan.progress:
            assert math.isclose(plan.progress[key], ref["progress"][key], rel_tol=0, abs_tol=1e-12)
        assert plan.mix.keys() == ref["mix"].keys()
        for key in plan.mix:
            assert math.isclose(plan.mix[key], ref["mix"][key], rel_tol=1e-12, abs_tol=1e-12)
    end = tracker.finish()
    assert list(end.unapplied) == ref_end["unapplied"]
    assert list(end.unfinished) == ref_end["unfinished"]


@settings(max_examples=400, deadline=None)
@given(default_n=st.integers(0, 6), raw_steps=steps_strategy)
def test_invariants(default_n: int, raw_steps: list) -> None:
    tracker, plans, steps, admitted = run_both(default_n, raw_steps)
    n_of = {
        s[1]: session_config(default_transition_chunks=default_n).transition_chunks(s[3])
        for s in steps
        if s[0] == "admit"
    }
    ends: dict[str, list[str]] = {}
    start_at: dict[str, int] = {}
    for plan in plans:
        assert all(w >= 0 for w in plan.mix.values())
        assert math.isclose(sum(plan.mix.values()), 1.0, abs_tol=1e-9)
        assert set(plan.progress) == set(plan.active)
        for eid in plan.started:
            assert eid not in start_at, "started at most once"
            start_at[eid] = plan.generation_chunk_index
        for eid, alpha in plan.progress.items():
            n = n_of[eid]
            k = plan.generation_chunk_index - start_at[eid] + 1
            assert alpha == (1.0 if n == 0 else k / n)
        for name in ("completed", "superseded", "interrupted"):
            for eid in getattr(plan, name):
                ends.setdefault(eid, []).append(name)
        for eid in plan.completed:
            n = n_of[eid]
            assert plan.generation_chunk_index - start_at[eid] == max(n - 1, 0)
    end = tracker.finish()
    for eid in end.unapplied:
        ends.setdefault(eid, []).append("unapplied")
        assert eid not in start_at
    for eid in end.unfinished:
        ends.setdefault(eid, []).append("unfinished")
    assert len(ends) == admitted
    assert all(len(v) == 1 for v in ends.values()), ends
    for eid, (how,) in ends.items():
        if how in ("completed", "interrupted", "unfinished"):
            assert eid in start_at
        else:
            assert eid not in start_at
