"""vLLM-Omni 0.32's coalescing, checked against its real prompt handler (from the 0.32.0rc1 wheel).

0.32's `PromptInteractionHandler` keeps the newest pending target (last write wins by
`received_at`) and reports the pending targets it replaced as `coalesced_event_ids` at the next
boundary: where they would have started. The same random sequences drive it and our
`TransitionTracker`; each chunk's `video.chunk_metadata` (`rtvideo.core.chunks.media_metadata`)
must carry 0.32's `coalesced_event_ids` exactly (absent when empty, as 0.32 sends it), and the
started and active lists and the blended conditioning must be equal.

One difference is 0.32's own and stays documented (docs/vllm-omni.md "vLLM-Omni 0.32"): an
in-flight transition that a newer one replaces is listed by 0.32 as completed; here it is
`interrupted_event_ids` (docs/protocol.md §5), so 0.32's completed list is our completed and
interrupted ones together.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rtvideo.core.chunks import COALESCED_EVENT_IDS, media_metadata
from rtvideo.core.errors import ErrorCode, ProtocolError
from rtvideo.core.event_book import MAX_PENDING_EVENTS, EventBook, EventState
from rtvideo.core.transitions import TransitionTracker
from tests.support.vllm_omni_wheel import Sampling, StepRequestState, load_prompt_handler, rc_wheel_path

PROMPTS = ("src", "A", "B", "C", "D")


def embedding(prompt: str) -> torch.Tensor:
    """One axis per prompt, so a blended embedding reads back as the mix that made it."""
    return torch.nn.functional.one_hot(torch.tensor(PROMPTS.index(prompt)), len(PROMPTS)).to(torch.float64)


class Handler032:
    """0.32's prompt handler as its engine runs it: every interaction stamped on arrival."""

    def __init__(self) -> None:
        module = load_prompt_handler(rc_wheel_path())
        self.handler = module.PromptInteractionHandler(
            encode_prompt=lambda prompt, **_: (embedding(prompt), None), device="cpu", dtype=torch.float64
        )
        self.state = StepRequestState("video_stream-test", Sampling(), prompt_embeds=embedding("src"))
        self.clock = 0.0

    def admit(self, event_id: str, prompt: str, n: int) -> None:
        self.clock += 1.0
        self.handler.enqueue(
            self.state, event_id=event_id, received_at=self.clock, payload={"prompt": prompt}, transition_chunks=n
        )

    def boundary(self) -> dict[str, list[str]]:
        if "prompt" not in self.state.interaction_sessions:  # a lazy handler: no session yet
            return {"started_event_ids": [], "active_event_ids": [], "completed_event_ids": []}
        meta = self.handler.apply_at_chunk_boundary(self.state, boundary_at=self.clock).as_dict()
        self.state.chunk_index += 1
        return meta


@dataclass
class Admit:
    prompt: str
    n: int


class Boundary:
    pass


ops = st.lists(
    st.one_of(st.builds(Admit, st.sampled_from(PROMPTS[1:]), st.integers(0, 4)), st.just(Boundary())),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_coalesced_event_ids_are_0_32s(sequence: list) -> None:
    theirs, tracker, book = Handler032(), TransitionTracker("src"), EventBook()
    transport = 0
    for i, op in enumerate(sequence):
        if isinstance(op, Admit):
            event_id = f"e{i}"
            theirs.admit(event_id, op.prompt, op.n)
            tracker.admit(event_id, op.prompt, op.n)
            book.admit(event_id, op.prompt.encode())
            book.acked(event_id)
            continue
        expected = theirs.boundary()
        plan = tracker.next_chunk()
        meta = media_metadata("rid", transport, plan, 9, 100)
        transport += 1
        book.observe(meta)
        assert meta.get(COALESCED_EVENT_IDS, []) == expected.get("coalesced_event_ids", [])
        assert COALESCED_EVENT_IDS not in meta or meta[COALESCED_EVENT_IDS]  # present only when not empty
        assert meta["started_event_ids"] == expected["started_event_ids"]
        assert meta["active_event_ids"] == expected["active_event_ids"]
        assert set(meta["completed_event_ids"]) | set(meta["interrupted_event_ids"]) == set(
            expected["completed_event_ids"]
        )
        mix = sum((w * embedding(p) for p, w in plan.mix.items()), torch.zeros(len(PROMPTS)))
        assert torch.allclose(theirs.state.prompt_embeds.to(torch.float64), mix.to(torch.float64))
        for event_id in meta.get(COALESCED_EVENT_IDS, []):
            assert book.state(event_id) is EventState.SUPERSEDED  # its one end


def test_golden_supersede_before_start_carries_0_32s_coalescing() -> None:
    """docs/protocol.md §5's last golden trace: A then B (N = 0) both queued before +1."""
    theirs, tracker = Handler032(), TransitionTracker("src")
    for event_id, n in (("A", 3), ("B", 0)):
        theirs.admit(event_id, event_id, n)
        tracker.admit(event_id, event_id, n)
    expected, meta = theirs.boundary(), media_metadata("rid", 0, tracker.next_chunk(), 9, 100)
    assert expected["coalesced_event_ids"] == meta[COALESCED_EVENT_IDS] == ["A"]
    assert meta["started_event_ids"] == meta["completed_event_ids"] == ["B"]
    expected, meta = theirs.boundary(), media_metadata("rid", 1, tracker.next_chunk(), 9, 100)
    assert "coalesced_event_ids" not in expected and COALESCED_EVENT_IDS not in meta


def test_a_0_32_engines_coalesced_list_ends_its_events_in_the_book() -> None:
    """A 0.32 engine's chunks name superseded targets only as `coalesced_event_ids`: the book
    (the proxy's and the model's) takes it as the same end."""
    book = EventBook()
    for event_id in ("A", "B"):
        book.admit(event_id, b"x")
        book.acked(event_id)
    book.observe({"type": "video.chunk_metadata", "started_event_ids": ["B"], "coalesced_event_ids": ["A"]})
    assert book.state("A") is EventState.SUPERSEDED and book.state("B") is EventState.STARTED


def test_the_pending_bound_is_interaction_queue_full_and_frees_at_a_boundary() -> None:
    book, tracker = EventBook(), TransitionTracker("src")
    for i in range(MAX_PENDING_EVENTS):
        book.admit(f"e{i}", b"x")
        tracker.admit(f"e{i}", "A", 0)
    with pytest.raises(ProtocolError) as full:
        book.admit("one-more", b"x")
    assert full.value.code is ErrorCode.INTERACTION_QUEUE_FULL and "one-more" not in book
    assert book.admit("e3", b"x") is False  # a retry is still acked again
    book.observe(media_metadata("rid", 0, tracker.next_chunk(), 9, 100))  # one starts, 63 coalesce
    assert book.admit("one-more", b"x") is True
