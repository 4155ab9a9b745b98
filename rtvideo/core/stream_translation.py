"""Engine-driven transitions: a streaming engine's per-chunk event ids into our chunk plans.

With the `vllm_omni` generator the engine (vLLM-Omni's `PromptInteractionHandler`)
applies prompt updates itself, at its own chunk boundaries, with the same linear rule
as `TransitionTracker` (docs/protocol.md §5). It reports, per chunk, only
`started/active/completed_event_ids`. This module derives the rest of our metadata from
that and from what this session admitted and forwarded, so that the wire is the same
whichever generator runs:

- `transition_progress`: α of each active event, from its admitted `transition_chunks`
  and the chunks it has been active (α = elapsed / N; 1.0 for N = 0);
- `interrupted_event_ids`: the transition in flight when the engine starts another one
  without completing it;
- `superseded_event_ids`: events forwarded to the engine before the one that starts and
  never started themselves (the engine keeps only the newest pending one).

`session.done`'s lists are not derived here: `rtvideo.core.event_book.EventBook` reads
them off the chunks actually sent, whichever generator made them.

Pure and deterministic, like `transitions.py`; `tests/unit/core/test_stream_translation.py`
drives it against vLLM-Omni's real handler and checks the result against the tracker.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rtvideo.core.transitions import ChunkPlan

#: keys of the engine's per-chunk stream metadata (`multimodal_output["metadata"]["stream"]`);
#: its `generation_chunk_index` is not used: ours counts the chunks this session sent, 0, 1, 2, …
STARTED, ACTIVE, COMPLETED = "started_event_ids", "active_event_ids", "completed_event_ids"


@dataclass
class _Flight:
    event_id: str
    chunks: int
    elapsed: int

    @property
    def progress(self) -> float:
        return 1.0 if self.chunks == 0 else min(1.0, self.elapsed / self.chunks)


@dataclass
class EngineStreamTranslator:
    """One session's view of the events it gave an engine, and the chunks the engine reported.

    Call `admit` when an event is acked (it waits, *held*, until it is `forwarded` to the
    engine), `failed` when the engine refused it (its end is `interaction_failed`), and
    `chunk` with each chunk's stream metadata, in order.
    """

    _chunks: dict[str, int] = field(default_factory=dict)  # admitted event -> its N
    _held: list[str] = field(default_factory=list)  # admitted, not yet given to the engine
    _forwarded: list[str] = field(default_factory=list)  # given to the engine, not started, in order
    _flight: _Flight | None = None
    _next_index: int = 0
    ignored: int = 0

    def admit(self, event_id: str, transition_chunks: int) -> None:
        """An acked event that should reach the engine (N already resolved, >= 0)."""
        if transition_chunks < 0:
            raise ValueError("transition chunks must be non-negative")
        self._chunks[event_id] = transition_chunks
        self._held.append(event_id)

    def forwarded(self, event_id: str) -> None:
        """The event was handed to the engine (after every event forwarded before it)."""
        self._held.remove(event_id)
        self._forwarded.append(event_id)

    def failed(self, event_id: str) -> None:
        """The engine refused the event: it never starts, and its end is an error, not a list."""
        for waiting in (self._held, self._forwarded):
            if event_id in waiting:
                waiting.remove(event_id)

    @property
    def held(self) -> tuple[str, ...]:
        return tuple(self._held)

    def chunk(self, stream: Mapping[str, Any] | None) -> ChunkPlan:
        """Our plan for the engine's next chunk, from its stream metadata (None: no events)."""
        stream = stream or {}
        started = self._known(stream.get(STARTED))
        completed = set(self._known(stream.get(COMPLETED)))
        active: list[str] = []
        progress: dict[str, float] = {}
        interrupted: list[str] = []
        superseded: list[str] = []
        flight = self._flight
        if flight is not None:  # step 1 of §5: the transition in flight advances one step
            flight.elapsed += 1
            active.append(flight.event_id)
            progress[flight.event_id] = flight.progress
            if flight.event_id in completed or flight.progress >= 1.0:
                flight = None
        if started:  # step 2: the newest target starts; the engine starts at most one per boundary
            event_id = started[-1]
            if flight is not None:
                interrupted.append(flight.event_id)
            if event_id in self._forwarded:
                position = self._forwarded.index(event_id)
                superseded = self._forwarded[:position]
                self._forwarded = self._forwarded[position + 1 :]
            n = self._chunks[event_id]
            flight = _Flight(event_id, n, 0 if n == 0 else 1)
            active.append(event_id)
            progress[event_id] = flight.progress
            if flight.progress >= 1.0:
                flight = None
        self._flight = flight
        # The engine's own lists win where it said something; progress decides the rest.
        done = [e for e in active if e in completed or progress[e] >= 1.0]
        index, self._next_index = self._next_index, self._next_index + 1
        return ChunkPlan(
            generation_chunk_index=index,
            mix={},
            started=tuple(started[-1:]),
            active=tuple(active),
            completed=tuple(done),
            superseded=tuple(superseded),
            interrupted=tuple(interrupted),
            progress=progress,
        )

    def _known(self, ids: Iterable[str] | None) -> list[str]:
        """The ids this session admitted: an id the engine names that was never acked here is
        not sent on (the ack-before-mention rule); `ignored` counts them."""
        out = []
        for event_id in ids or ():
            if event_id in self._chunks:
                out.append(event_id)
            else:
                self.ignored += 1
        return out
