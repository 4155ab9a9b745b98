"""`rebuild`: the model-internal `session.start` extension that rebuilds a session's state up to
a generation chunk, then streams from it (docs/triton-model.md "Rebuilding a session").

A session of the built-in generator is a pure function of its configuration, its seed and where
each event took effect: the generation chunk that started it and, for a camera event, the frame
within that chunk (`event_frame_offsets`). A `rebuild` lists those; the source admits each event
just before its chunk's boundary with its frame forced, steps its trackers through the chunks
before `generation_chunk_index` without rendering, and streams from there.

An event is history (the default: a branch's recorded events, never named on the new stream)
or `named`: the session's own, which the new stream names in its chunk lists as the old one
would have and whose id a retry finds known (a session moved to another Triton, whose events
keep their place).

A generator whose state cannot be rebuilt (vLLM-Omni's engine) takes a rebuild as an
approximation (rtvideo.core.approximation): the start carries the last frame as its
`image_reference` and the prompt in effect; the source only numbers its chunks from N on and
lists the named events marked `open` (in progress at the cut) as completed in its first chunk.

Not a client field: the proxy strips it from what clients send; only a trusted caller of the
model (the proxy's branching and moves, a direct gRPC client holding Triton's key) sends it.

Pure: decoded JSON in, dataclasses out; every failure is a `ProtocolError` (`invalid_start`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rtvideo.core.errors import ErrorCode, ProtocolError
from rtvideo.core.fields import as_int, json_kind
from rtvideo.core.interaction.parse import parse_interaction
from rtvideo.core.interaction.types import InteractionRequest
from rtvideo.core.protocol import INTERACTION

REBUILD = "rebuild"
#: most events one rebuild may carry (a session's own bound: `event_book.MAX_EVENTS_PER_SESSION`)
MAX_REBUILD_EVENTS = 10_000
#: the furthest chunk a rebuild may reach (about 17 hours at 9 frames a chunk, 16 fps)
MAX_REBUILD_CHUNK = 1_000_000
#: the most frames an approximation's `frames_before` may name (a session's longest, with room)
MAX_REBUILD_FRAMES = 100_000_000

_BAD = ErrorCode.INVALID_START


@dataclass(frozen=True)
class ScriptedEvent:
    """One event of a rebuild: the interaction as it was sent, the generation chunk at which it
    started and the frame of that chunk at which it took effect (0 but for camera events)."""

    chunk: int
    frame_offset: int
    request: InteractionRequest
    named: bool = False  # the session's own event (module docstring); else history
    #: in progress when the old stream stopped: an approximate rebuild (a generator whose state
    #: cannot be rebuilt, docs/triton-model.md) lists it completed in its first chunk
    open: bool = False

    @property
    def event_id(self) -> str:
        assert self.request.event_id is not None  # parse_rebuild requires one
        return self.request.event_id


@dataclass(frozen=True)
class Rebuild:
    """Rebuild the state up to `generation_chunk_index` (N) and stream from it. `events`: those
    that started at chunks 0..N, in the order they were received (sorted by chunk, stably)."""

    generation_chunk_index: int
    events: tuple[ScriptedEvent, ...] = ()
    #: an approximation's (rtvideo.core.approximation): frames the old stream had before N, which
    #: the model takes off the length it resolves (`num_frames`, or `seconds` x fps); 0 otherwise
    frames_before: int = 0

    @property
    def history_ids(self) -> frozenset[str]:
        """The events no list of the new stream names."""
        return frozenset(event.event_id for event in self.events if not event.named)

    @property
    def named(self) -> tuple[ScriptedEvent, ...]:
        return tuple(event for event in self.events if event.named)

    def to_json(self) -> dict[str, Any]:
        """The `rebuild` field that parses back to this."""
        return {
            "generation_chunk_index": self.generation_chunk_index,
            "events": [
                {
                    "chunk": e.chunk,
                    "frame_offset": e.frame_offset,
                    "interaction": interaction_json(e.request),
                    **({"named": True} if e.named else {}),
                    **({"open": True} if e.open else {}),
                }
                for e in self.events
            ],
            **({"frames_before": self.frames_before} if self.frames_before else {}),
        }


def interaction_json(request: InteractionRequest) -> dict[str, Any]:
    """`session.interaction`'s `interaction` object for a parsed request (what was sent)."""
    out: dict[str, Any] = {"event_id": request.event_id, "event": dict(request.event)}
    if request.transition_chunks is not None:
        out["transition_chunks"] = request.transition_chunks
    if request.interpolation is not None:
        out["interpolation"] = request.interpolation
    return out


def interaction_message(request: InteractionRequest) -> bytes:
    """The canonical `session.interaction` frame of a parsed request: what the proxy forwards to
    the model, keeps in the session store and in a move's log, so a takeover or a move rebuilds
    exactly what the model got. Nothing the parser ignores (a top-level field, a null prompt)
    survives: its size is bounded by what parsing bounds, not by what a client sent."""
    message = {"type": INTERACTION, "interaction": interaction_json(request)}
    return json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass")


def split_start(obj: Mapping[str, Any]) -> tuple[dict[str, Any], Rebuild | None]:
    """A decoded `session.start` without its `rebuild` (validated here), and the rebuild."""
    fields = dict(obj)
    if REBUILD not in fields:
        return fields, None
    return fields, parse_rebuild(fields.pop(REBUILD))


def parse_rebuild(value: Any) -> Rebuild:
    """Validate a `rebuild` object (module docstring)."""
    if not isinstance(value, dict):
        raise ProtocolError(_BAD, f"rebuild must be an object, not {json_kind(value)}")
    unknown = sorted(set(value) - {"generation_chunk_index", "events", "frames_before"})
    if unknown:
        raise ProtocolError(_BAD, f"unknown rebuild field(s): {', '.join(unknown)}")
    if "generation_chunk_index" not in value:
        raise ProtocolError(_BAD, "rebuild needs generation_chunk_index")
    target = as_int(value["generation_chunk_index"], "rebuild.generation_chunk_index", 0, MAX_REBUILD_CHUNK, _BAD)
    before = as_int(value.get("frames_before", 0), "rebuild.frames_before", 0, MAX_REBUILD_FRAMES, _BAD)
    raw_events = value.get("events", [])
    if not isinstance(raw_events, list):
        raise ProtocolError(_BAD, f"rebuild.events must be an array, not {json_kind(raw_events)}")
    if len(raw_events) > MAX_REBUILD_EVENTS:
        raise ProtocolError(_BAD, f"rebuild.events holds more than {MAX_REBUILD_EVENTS} events")
    events: list[ScriptedEvent] = []
    seen: set[str] = set()
    for index, raw in enumerate(raw_events):
        name = f"rebuild.events[{index}]"
        if not isinstance(raw, dict):
            raise ProtocolError(_BAD, f"{name} must be an object, not {json_kind(raw)}")
        unknown = sorted(set(raw) - {"chunk", "frame_offset", "interaction", "named", "open"})
        if unknown:
            raise ProtocolError(_BAD, f"unknown {name} field(s): {', '.join(unknown)}")
        chunk = as_int(raw.get("chunk"), f"{name}.chunk", 0, target, _BAD)
        frame = as_int(raw.get("frame_offset", 0), f"{name}.frame_offset", 0, MAX_REBUILD_CHUNK, _BAD)
        named, is_open = raw.get("named", False), raw.get("open", False)
        for flag, given in (("named", named), ("open", is_open)):
            if not isinstance(given, bool):
                raise ProtocolError(_BAD, f"{name}.{flag} must be a boolean, not {json_kind(given)}")
        try:
            request = parse_interaction({"interaction": raw.get("interaction")})
        except ProtocolError as exc:
            raise ProtocolError(_BAD, f"{name}.interaction: {exc.message}") from None
        if request.event_id is None:
            raise ProtocolError(_BAD, f"{name}.interaction needs its event_id")
        if request.event_id in seen:
            raise ProtocolError(_BAD, f"{name}: event_id {request.event_id!r} appears twice")
        seen.add(request.event_id)
        events.append(ScriptedEvent(chunk, frame, request, named, is_open))
    events.sort(key=lambda e: e.chunk)  # stable: the order received within a chunk
    return Rebuild(target, tuple(events), before)


def check_rebuild(rebuild: Rebuild, *, frames_per_chunk: int, num_frames: int | None) -> None:
    """What a session's configuration allows: every event's frame within a chunk, and chunk N
    within the session's length."""
    for event in rebuild.events:
        if event.frame_offset >= frames_per_chunk:
            raise ProtocolError(
                _BAD,
                f"rebuild: event {event.event_id!r} has frame_offset {event.frame_offset}; "
                f"a chunk has {frames_per_chunk} frames",
            )
    if num_frames is not None and rebuild.generation_chunk_index * frames_per_chunk >= num_frames:
        raise ProtocolError(
            _BAD,
            f"rebuild.generation_chunk_index {rebuild.generation_chunk_index} is past the session's "
            f"{num_frames} frames",
        )
