"""Prompt-transition tracker (docs/protocol.md §5, vLLM-Omni's `PromptInteractionHandler`).

Pure and deterministic: events are admitted as they arrive (with their N already
resolved: `SessionConfig.transition_chunks`), and each chunk boundary resolves into the
chunk's prompt mix plus the event-id lists the metadata carries. A mix is a convex
combination over prompt keys, so a generator blends embeddings exactly and never sees
protocol messages. A target may be a prompt or a blend (`rtvideo.core.conditioning`), reached
linearly or by slerp: the chunk's `mix` is then a conditioning recipe the generator resolves
against its embeddings (a mix whenever nothing involves slerp). Which events are still open when the stream ends is not the tracker's
to say: `rtvideo.core.event_book.EventBook` reads it off the chunks actually sent.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from rtvideo.core.conditioning import LINEAR, Conditioning, interpolate


@dataclass(frozen=True)
class Target:
    """An admitted prompt (or blend) target waiting for (or in) its transition, reached by
    `interpolation` (`conditioning.INTERPOLATIONS`)."""

    event_id: str
    conditioning: Conditioning
    chunks: int
    interpolation: str = LINEAR


@dataclass
class _Transition:
    target: Target
    source: Conditioning
    elapsed: int = 0

    @property
    def progress(self) -> float:
        return 1.0 if self.target.chunks == 0 else self.elapsed / self.target.chunks

    @property
    def done(self) -> bool:
        return self.elapsed >= self.target.chunks

    def mix(self) -> Conditioning:
        if self.done:
            return self.target.conditioning
        return interpolate(self.source, self.target.conditioning, self.progress, self.target.interpolation)


@dataclass(frozen=True)
class ChunkPlan:
    """Everything one generation chunk needs: the mix to render and the ids to report."""

    generation_chunk_index: int
    #: what the chunk is conditioned on: a `{prompt: weight}` mix, or a recipe with slerp
    mix: Conditioning
    started: tuple[str, ...] = ()
    active: tuple[str, ...] = ()
    completed: tuple[str, ...] = ()
    superseded: tuple[str, ...] = ()
    interrupted: tuple[str, ...] = ()
    progress: dict[str, float] = field(default_factory=dict)
    #: `event_frame_offsets`: the frame of this chunk at which a started event took effect, for
    #: those after frame 0 (camera events; docs/protocol.md §6). Empty: the metadata omits it
    frame_offsets: dict[str, int] = field(default_factory=dict)


@dataclass
class TransitionTracker:
    """Admits prompt targets (the newest pending wins) and resolves chunk boundaries.
    `initial_prompt`: the start's prompt, or its blend's conditioning."""

    initial_prompt: str | Conditioning
    _state: Conditioning = field(init=False)
    _flight: _Transition | None = field(init=False, default=None)
    _pending: Target | None = field(init=False, default=None)
    _dropped: list[str] = field(init=False, default_factory=list)
    _next_index: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        initial = self.initial_prompt
        self._state = {initial: 1.0} if isinstance(initial, str) else initial

    def admit(self, event_id: str, prompt: str | Conditioning, chunks: int, interpolation: str = LINEAR) -> Target:
        """Queue a target (a prompt, or a blend's conditioning) for the next boundary; an older
        pending target, prompt or blend, is superseded."""
        target = Target(event_id, {prompt: 1.0} if isinstance(prompt, str) else prompt, chunks, interpolation)
        if target.chunks < 0:
            raise ValueError("transition chunks must be non-negative")
        if self._pending is not None:
            self._dropped.append(self._pending.event_id)
        self._pending = target
        return target

    def next_chunk(self) -> ChunkPlan:
        """Resolve the boundary before the next chunk, in the order of docs/protocol.md §5."""
        active: list[str] = []
        completed: list[str] = []
        started: list[str] = []
        interrupted: list[str] = []
        progress: dict[str, float] = {}
        flight = self._flight
        if flight is not None:  # step 1: the in-flight transition advances one step
            flight.elapsed += 1
            self._state = flight.mix()
            active.append(flight.target.event_id)
            progress[flight.target.event_id] = flight.progress
            if flight.done:
                completed.append(flight.target.event_id)
                self._flight = flight = None
        if self._pending is not None:  # step 2: the newest pending target starts from step 1's state
            if flight is not None:
                interrupted.append(flight.target.event_id)
            target, self._pending = self._pending, None
            flight = _Transition(target, self._state, elapsed=0 if target.chunks == 0 else 1)
            self._state = flight.mix()
            started.append(target.event_id)
            active.append(target.event_id)
            progress[target.event_id] = flight.progress
            if flight.done:
                completed.append(target.event_id)
                flight = None
            self._flight = flight
        superseded, self._dropped = tuple(self._dropped), []
        index, self._next_index = self._next_index, self._next_index + 1
        return ChunkPlan(
            generation_chunk_index=index,
            mix=dict(self._state) if isinstance(self._state, Mapping) else self._state,
            started=tuple(started),
            active=tuple(active),
            completed=tuple(completed),
            superseded=superseded,
            interrupted=tuple(interrupted),
            progress=progress,
        )
