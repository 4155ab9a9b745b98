"""Per-kind handlers: how a source applies the parts of an acked event (vLLM-Omni's
`InteractionCoordinator.enqueue_parts` over its handler registry, in our terms).

A source registers one handler per kind it applies; `admit` hands each part of an event to
its kind's handler, in the event's order (the prompt first). Admission is all or nothing:
an event with a kind the registry lacks changes nothing (`UnhandledKinds`), so a composite
event never half-applies. Such an event never gets here from a session: the model refuses it
first (`refusal.interaction_refusal`, from the generator's `InteractionSupport.kinds`, which
a test keeps equal to the built-in source's registry).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

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

    def admit(self, interaction: Interaction) -> None:
        """Each part to its handler, in order; raises `UnhandledKinds` (having applied nothing)."""
        missing = [kind for kind in interaction.kinds if kind not in self._handlers]
        if missing:
            raise UnhandledKinds(missing)
        for part in interaction.parts:
            self._handlers[part.kind](interaction, part)
