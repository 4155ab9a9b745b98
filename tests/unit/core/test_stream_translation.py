"""Engine mode's translation, checked against vLLM-Omni's real prompt handler (from its wheel).

The same random interaction sequences drive (a) `PromptInteractionHandler` from the pinned
vllm-omni wheel, whose per-chunk `started/active/completed_event_ids` feed our
`EngineStreamTranslator`, and (b) our `TransitionTracker`, the built-in path. The wire
lists, the progress, the blended conditioning and `session.done`'s lists (each side's
`EventBook`, fed as the session feeds it) must be equal, and every acked event must reach
exactly one end.

The engine refuses interactions before its first output, so the translator holds them
and the source forwards them after chunk 0 (as `EngineChunkSource` does); the tracker
gets each event when the engine does.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rtvideo.core.event_book import EventBook
from rtvideo.core.stream_translation import EngineStreamTranslator
from rtvideo.core.transitions import ChunkPlan, TransitionTracker
from tests.support.session_configs import session_config
from tests.support.vllm_omni_wheel import (
    Sampling,
    StepRequestState,
    load_prompt_handler,
)

PROMPTS = ("src", "A", "B", "C", "D")
#: a plan's event lists
LISTS = ("started", "active", "completed", "superseded", "interrupted")
CONFIG = session_config()


def embedding(prompt: str) -> torch.Tensor:
    """One axis per prompt, so a blended embedding reads back as the mix that made it."""
    return torch.nn.functional.one_hot(torch.tensor(PROMPTS.index(prompt)), len(PROMPTS)).to(torch.float64)


def enter(book: EventBook, plan: ChunkPlan) -> None:
    """A sent chunk's lists, as the session enters them in its book."""
    book.chunk(started=plan.started, completed=plan.completed, interrupted=plan.interrupted, superseded=plan.superseded)


def wire(plan: ChunkPlan) -> dict:
    """What the chunk's metadata carries of the plan: its event lists and progress."""
    return {key: getattr(plan, key) for key in (*LISTS, "progress")}


@dataclass
class Admit:
    prompt: str
    n: int | None
    refused: bool = False  # the engine refuses it (an engine error about this one event)


class Boundary:
    pass


class EngineSide:
    """vLLM-Omni's handler as the engine runs it, with our translator and the holding rule."""

    def __init__(self) -> None:
        module = load_prompt_handler()
        self.handler = module.PromptInteractionHandler(
            encode_prompt=lambda prompt, **_: (embedding(prompt), None), device="cpu", dtype=torch.float64
        )
        self.state = StepRequestState("video_stream-test", Sampling(), prompt_embeds=embedding("src"))
        self.translator = EngineStreamTranslator()
        self.book = EventBook()  # the session's, beside the translator
        self.first_output = False
        self.prompts: dict[str, tuple[str, int]] = {}
        self.refused: set[str] = set()  # will be refused when forwarded
        self.failed: list[str] = []  # were refused: their end is interaction_failed
        self.received: list[tuple[str, str, int]] = []  # what reached the engine, in order

    def admit(self, event_id: str, prompt: str, n: int | None, refused: bool) -> None:
        n = CONFIG.transition_chunks(n)
        self.book.admit(event_id, prompt.encode())
        self.book.acked(event_id)
        self.translator.admit(event_id, n)
        self.prompts[event_id] = (prompt, n)
        if refused:
            self.refused.add(event_id)
        if self.first_output:
            self.forward(event_id)

    def forward(self, event_id: str) -> None:
        prompt, n = self.prompts[event_id]
        self.translator.forwarded(event_id)
        if event_id in self.refused:
            self.translator.failed(event_id)  # submit_interaction_async raised: interaction_failed
            self.book.failed(event_id)
            self.failed.append(event_id)
            return
        self.handler.enqueue(
            self.state, event_id=event_id, received_at=0.0, payload={"prompt": prompt}, transition_chunks=n
        )
        self.received.append((event_id, prompt, n))

    def boundary(self) -> ChunkPlan:
        # InteractionCoordinator's rule: a lazy handler runs only once its session exists
        if "prompt" in self.state.interaction_sessions:
            meta = self.handler.apply_at_chunk_boundary(self.state, boundary_at=0.0).as_dict()
        else:
            meta = {"started_event_ids": [], "active_event_ids": [], "completed_event_ids": []}
        plan = self.translator.chunk({**meta, "generation_chunk_index": self.state.chunk_index})
        enter(self.book, plan)
        self.state.chunk_index += 1
        if not self.first_output:  # the chunk's output arrived: forward what was held
            self.first_output = True
            for event_id in self.translator.held:
                self.forward(event_id)
        return plan


ops = st.lists(
    st.one_of(
        st.builds(
            Admit,
            st.sampled_from(PROMPTS[1:]),
            st.one_of(st.none(), st.integers(0, 4)),
            st.sampled_from([False] * 7 + [True]),
        ),
        st.just(Boundary()),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_engine_translation_equals_the_builtin_tracker(sequence: list) -> None:
    engine = EngineSide()
    tracker, tracker_book = TransitionTracker("src"), EventBook()
    seen = 0  # events of engine.received the tracker has been given
    ends: dict[str, int] = {}
    admitted: list[str] = []
    for i, op in enumerate(sequence):
        if isinstance(op, Admit):
            event_id = f"e{i}"
            admitted.append(event_id)
            engine.admit(event_id, op.prompt, op.n, op.refused)
        else:
            plan = engine.boundary()
            reference = tracker.next_chunk()
            enter(tracker_book, reference)
            assert wire(plan) == wire(reference), f"chunk {reference.generation_chunk_index}"
            # the engine's blended conditioning is the tracker's mix
            expected = sum((w * embedding(p) for p, w in reference.mix.items()), torch.zeros(len(PROMPTS)))
            assert torch.allclose(engine.state.prompt_embeds.to(torch.float64), expected.to(torch.float64)), (
                engine.state.prompt_embeds,
                reference.mix,
            )
            for key in ("completed", "superseded", "interrupted"):
                for event_id in getattr(plan, key):
                    ends[event_id] = ends.get(event_id, 0) + 1
        for event_id, prompt, n in engine.received[seen:]:  # the tracker gets them when the engine does
            tracker_book.admit(event_id, prompt.encode())
            tracker_book.acked(event_id)
            tracker.admit(event_id, prompt, n)
        seen = len(engine.received)
    outcome = engine.book.outcome()
    reference = tracker_book.outcome()
    assert outcome.unfinished == reference.unfinished
    # the tracker never saw events still held at the end: they are unapplied too
    held = tuple(e for e in admitted if e in engine.translator.held)
    assert outcome.unapplied == reference.unapplied + held
    for event_id in [*outcome.unapplied, *outcome.unfinished, *engine.failed]:
        ends[event_id] = ends.get(event_id, 0) + 1
    assert {e: ends.get(e, 0) for e in admitted} == {e: 1 for e in admitted}, "every acked event: exactly one end"


def test_golden_interrupt_through_the_engine() -> None:
    """docs/protocol.md §5: A (N = 3), then B (N = 2) acked before +2, after the first output."""
    engine = EngineSide()
    engine.boundary()  # chunk 0: the first output
    engine.admit("A", "A", 3, False)
    p1 = engine.boundary()
    engine.admit("B", "B", 2, False)
    p2, p3 = engine.boundary(), engine.boundary()
    assert (p1.started, p1.active, p1.progress) == (("A",), ("A",), {"A": pytest.approx(1 / 3)})
    assert (p2.started, p2.active, p2.interrupted) == (("B",), ("A", "B"), ("A",))
    assert p2.progress == {"A": pytest.approx(2 / 3), "B": pytest.approx(0.5)}
    assert (p3.active, p3.completed) == (("B",), ("B",))
    assert engine.book.outcome().unapplied == () and engine.book.outcome().unfinished == ()


def test_events_before_the_first_output_are_held_then_superseded_like_the_tracker() -> None:
    engine = EngineSide()
    engine.admit("A", "A", None, False)
    engine.admit("B", "B", 0, False)
    assert engine.received == []  # the engine refuses interactions before its first output
    p0 = engine.boundary()
    assert wire(p0)["started"] == () and [e for e, _, _ in engine.received] == ["A", "B"]
    p1 = engine.boundary()
    assert (p1.started, p1.completed, p1.superseded) == (("B",), ("B",), ("A",))
    assert p1.progress == {"B": 1.0}


def test_unknown_ids_from_the_engine_are_not_sent_on() -> None:
    translator = EngineStreamTranslator()
    plan = translator.chunk(
        {"started_event_ids": ["ghost"], "active_event_ids": ["ghost"], "completed_event_ids": ["ghost"]}
    )
    assert plan.started == plan.active == plan.completed == () and translator.ignored == 2
