"""The typed parts of a `session.interaction`, parsed once (`parse.parse_interaction`).

An interaction is an envelope (`event_id`, `transition_chunks`) around one event, and the
event is a list of parts, one per kind, in vLLM-Omni 0.30's order
(`DiffusionModelRunner.submit_interaction`): the prompt first, then each `multi_modal_data`
modality as sent. Every reader of an event reads these parts: the proxy (its acks), the
model's admission (whether it is refused: `refusal.interaction_refusal`) and each source
(`registry`), so a payload is validated and interpreted in one place.

Two types, two moments:
- `InteractionRequest`: the message as validated. `transition_chunks` is as sent (None when
  absent); its identity (`fingerprint`) is the payload, never the parsed parts.
- `Interaction`: an acked event as a source takes it: an id, a receipt time, and each part's
  N resolved (`chunks`), so no source applies a default of its own.

Invariant: `parts` is never empty, holds at most one part per kind, and the prompt (when
present) comes first.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from rtvideo.core import camera
from rtvideo.core.camera import CameraCommand
from rtvideo.core.conditioning import LINEAR, normalise
from rtvideo.core.event_types import OmniInteractionEvent

# --- kinds --------------------------------------------------------------------------------
PROMPT = "prompt"
CAMERA = camera.MODALITY
#: a weighted prompt blend (`event.prompts`, in place of `event.prompt`): it takes the prompt's
#: slot everywhere (its default N, the transition tracker, supersede rules)
BLEND = "blend"

#: the N of a kind whose default is fixed when the interaction sets none; the prompt's is the
#: session's (`SessionConfig.default_transition_chunks`), the camera's vLLM-Omni's handler's
FIXED_DEFAULT_CHUNKS: Mapping[str, int] = {CAMERA: camera.DEFAULT_TRANSITION_CHUNKS}
#: a modality only the engine interprets: the engine applies its own default; this one only
#: paces the progress we report for it (vLLM-Omni's non-prompt handlers default to 1)
ENGINE_KIND_CHUNKS = 1


@dataclass(frozen=True)
class PromptPart:
    """`event.prompt`: the scene to move to."""

    kind: ClassVar[str] = PROMPT
    text: str


@dataclass(frozen=True)
class CameraPart:
    """`event.multi_modal_data.camera`, validated (`rtvideo.core.camera.parse_camera`)."""

    kind: ClassVar[str] = CAMERA
    command: CameraCommand


@dataclass(frozen=True)
class BlendPart:
    """`event.prompts`, a weighted prompt blend in place of a prompt: each `(text, weight)` as
    sent, weights normalised to sum to 1. How it is interpolated is the envelope's
    (`InteractionRequest.interpolation`, resolved in `Interaction.interpolation`)."""

    kind: ClassVar[str] = BLEND
    prompts: tuple[tuple[str, float], ...]


@dataclass(frozen=True)
class ModalityPart:
    """A `multi_modal_data` modality we do not interpret: the engine does (or refuses it)."""

    modality: str
    payload: Mapping[str, Any]

    @property
    def kind(self) -> str:
        return self.modality


Part = PromptPart | CameraPart | BlendPart | ModalityPart


def parts_of(event: Mapping[str, Any]) -> tuple[Part, ...]:
    """The parts of an event already validated (`parse.parse_interaction` checks first, and
    hands its parts over; this serves events built in code). A bad camera raises `CameraError`."""
    parts: list[Part] = []
    prompt = event.get("prompt")
    if isinstance(prompt, str):
        parts.append(PromptPart(prompt))
    elif isinstance(event.get("prompts"), list):
        parts.append(BlendPart(normalise([(p["text"], float(p["weight"])) for p in event["prompts"]])))
    for modality, payload in (event.get("multi_modal_data") or {}).items():
        if modality == CAMERA:
            parts.append(CameraPart(camera.parse_camera(payload)))
        else:
            parts.append(ModalityPart(str(modality), payload))
    return tuple(parts)


def _find(parts: tuple[Part, ...], kind: str) -> Part | None:
    return next((part for part in parts if part.kind == kind), None)


class _Parts:
    """Reading an event's parts (shared by both moments)."""

    parts: tuple[Part, ...]

    @property
    def kinds(self) -> tuple[str, ...]:
        """The event's kinds, in order (the prompt first)."""
        return tuple(part.kind for part in self.parts)

    @property
    def prompt(self) -> str | None:
        part = _find(self.parts, PROMPT)
        return part.text if isinstance(part, PromptPart) else None

    @property
    def blend(self) -> tuple[tuple[str, float], ...] | None:
        """The blend's normalised `(text, weight)`s, or None."""
        part = _find(self.parts, BLEND)
        return part.prompts if isinstance(part, BlendPart) else None

    @property
    def camera(self) -> CameraCommand | None:
        part = _find(self.parts, CAMERA)
        return part.command if isinstance(part, CameraPart) else None


@dataclass(frozen=True)
class InteractionRequest(_Parts):
    """A validated `session.interaction`; `event_id` is None when the server must assign one."""

    event: OmniInteractionEvent
    event_id: str | None = None
    transition_chunks: int | None = None
    #: `interaction.interpolation` as sent (None: the session's default, `SessionConfig.interpolation`)
    interpolation: str | None = None
    #: the event's parts (`parts_of` when not given); not part of its identity: the event is
    parts: tuple[Part, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        if not self.parts:
            object.__setattr__(self, "parts", parts_of(self.event))

    @property
    def fingerprint(self) -> bytes:
        """Canonical payload identity for idempotency (docs/protocol.md §4): the SHA-256 of the
        canonical JSON, so a session keeps 32 bytes per event id, whatever the prompt's size.
        `interpolation` is part of it when sent (so a request without one keeps its old identity)."""
        payload: dict[str, Any] = {"event": self.event, "transition_chunks": self.transition_chunks}
        if self.interpolation is not None:
            payload["interpolation"] = self.interpolation
        canonical = json.dumps(
            payload,
            sort_keys=True,
            separators=(",", ":"),
        )
        return hashlib.sha256(canonical.encode("ascii")).digest()

    def with_event_id(self) -> InteractionRequest:
        """The same request with a server-generated id when the client sent none."""
        if self.event_id is not None:
            return self
        return InteractionRequest(self.event, str(uuid.uuid4()), self.transition_chunks, self.interpolation, self.parts)


def resolve_chunks(kind: str, sent: int | None, prompt_default: int) -> int:
    """A part's N: the interaction's own `transition_chunks`, else its kind's default. The one
    place a default N is applied."""
    if sent is not None:
        return sent
    if kind in (PROMPT, BLEND):
        return prompt_default
    return FIXED_DEFAULT_CHUNKS.get(kind, ENGINE_KIND_CHUNKS)


@dataclass(frozen=True)
class Interaction(_Parts):
    """An acked event, as every source receives it (`ChunkSource.admit_event`).

    `chunks` holds each part's N, resolved (`resolve_chunks`); `transition_chunks` is the N as
    sent, for an engine that applies its own defaults to what it is forwarded. `received_at`
    (monotonic) places the event in its chunk (`rtvideo.core.camera.frame_offset`); `event` is
    the payload as validated, for an engine that takes it unchanged."""

    event_id: str
    event: Mapping[str, Any]
    parts: tuple[Part, ...]
    chunks: Mapping[str, int]
    transition_chunks: int | None
    received_at: float
    #: how the prompt or blend part is interpolated (`conditioning.INTERPOLATIONS`), resolved:
    #: the interaction's own, else the session's default
    interpolation: str = LINEAR

    @property
    def prompt_chunks(self) -> int:
        """The prompt (or blend) part's N (a prompt-less event: 0, never read)."""
        return self.chunks.get(PROMPT, self.chunks.get(BLEND, 0))

    @classmethod
    def admitted(
        cls,
        request: InteractionRequest,
        event_id: str,
        *,
        prompt_default: int,
        received_at: float,
        interpolation_default: str = LINEAR,
    ) -> Interaction:
        """The acked `session.interaction`, each part's N resolved (`prompt_default`: the
        session's default N for prompts) and its interpolation (`interpolation_default`: the
        session's)."""
        sent = request.transition_chunks
        chunks = {kind: resolve_chunks(kind, sent, prompt_default) for kind in request.kinds}
        interpolation = request.interpolation or interpolation_default
        return cls(event_id, request.event, request.parts, chunks, sent, received_at, interpolation)
