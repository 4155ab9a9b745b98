"""What interactions a generator takes, as one table a client is told (`video.start`
`config.interactions`, `GET /v1/models`) and the model enforces (docs/protocol.md §2.2).

Pure. Each generator's entry lives in `rtvideo.backend.catalog.GENERATORS`; the model's
settings narrow the kinds to the deployed pipeline's (`BackendSettings.interactions`).
What the parser accepts is wider (every field any generator takes): an event that sets a
field, or an interpolation, the active generator does not take is acked and then fails with
`interaction_failed` naming it (`refusal.interaction_refusal` decides), as an unsupported
`OmniTextPrompt` field does; a start that does is `invalid_start` naming it (`start_problem`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rtvideo.core.conditioning import LINEAR


@dataclass(frozen=True)
class InteractionSupport:
    """One generator's interactions: the kinds it applies (None: only its engine knows), the
    `event` fields it takes, and the interpolation methods (the first is the default)."""

    kinds: tuple[str, ...] | None
    event_fields: tuple[str, ...]
    interpolation: tuple[str, ...] = (LINEAR,)

    def describe(self) -> dict[str, Any]:
        """As `config.interactions` and `/v1/models` state it."""
        return {
            "kinds": None if self.kinds is None else list(self.kinds),
            "event_fields": list(self.event_fields),
            "interpolation": list(self.interpolation),
        }

    def start_problem(self, *, blend: bool, interpolation: str | None) -> str | None:
        """Why a start's `prompts` or `interpolation` cannot be honoured here, or None."""
        if blend and "prompts" not in self.event_fields:
            return "prompts (a prompt blend) is not supported by this model: send a single prompt"
        if interpolation is not None and interpolation not in self.interpolation:
            return (
                f"interpolation {interpolation!r} is not supported by this model: use {', '.join(self.interpolation)}"
            )
        return None
