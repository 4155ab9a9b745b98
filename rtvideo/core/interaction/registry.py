"""Per-kind handlers: how a source applies the parts of an acked event (vLLM-Omni's
`InteractionCoordinator.enqueue_parts` over its handler registry, in our terms).

A source registers one handler per kind it applies; `admit` hands each part of an event to
its kind's handler, in the event's order (the prompt first). Admission is all or nothing:
an event with a kind the registry lacks changes nothing (`UnhandledKinds`), so a composite
event never half-applies. The session asks `missing` before it admits, and refuses such an
event with its own message.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from rtvideo.core.interaction.types import Interaction, Part

#: applies one part of an acked event (its N is `interaction.chunks[part.kind]`)
Handler = Callable[[Interaction, Part], None]


class UnhandledKinds(ValueError):
    """An event with kinds no handler applies; nothing of it was admitted."""

    def __init__(self, kinds: list[str]) -> None:
        super().__init__(f"no handler for interaction kind(s) {', '.join(map(repr, kinds))}")
        self.kinds = kinds


class HandlerRegistry:
    """One source's handlers, by kind."""

    def __init__(self, handlers: Mapping[str, Handler]) -> None:
        self._handlers = dict(handlers)

    @property
    def kinds(self) -> frozenset[str]:
        return frozenset(self._handlers)

    def missing(self, kinds: Iterable[str]) -> list[str]:
        """The kinds no handler here applies, in the event's order."""
        return [kind for kind in kinds if kind not in self._handlers]

    def admit(self, interaction: Interaction) -> None:
        """Each part to its handler, in order; raises `UnhandledKinds` (having applied nothing)."""
        missing = self.missing(interaction.kinds)
        if missing:
            raise UnhandledKinds(missing)
        for part in interaction.parts:
            self._handlers[part.kind](interaction, part)
