"""A recording's event log as the session's state: what a replay or a rebuild needs from it.

The built-in generator is a pure function of its configuration, its seed and where each event
took effect (docs/recordings.md "Branching"). A recording's `events.jsonl` (`{"t", "dir",
"message"}` lines, docs/recordings.md) holds all of it: the `session.start` as sent (in), the
`video.start` `config` with the seed it ran with (out), each `session.interaction` as sent (in)
with its ack or refusal (out), and each media chunk's `generation_chunk_index`,
`started_event_ids` and `event_frame_offsets` (out).

`read_log` turns those lines into a `SessionLog`: the start (the recorded fields, the seed
pinned), and every interaction that started, as sent, with the generation chunk at which it
started and its frame offset there. Events that never started (superseded before their
boundary, refused, failed, unapplied) changed nothing and are left out.

Which payload an event id stands for: the one whose message was acked (a retry repeats it;
a message answered with an error naming the id, `event_id_conflict` or `rate_limited`, was not
applied). An interaction sent without an `event_id` got one from the server: it is paired, in
order, with the acks of ids no client message named.

Pure: lines (text or decoded) in, dataclasses out; a malformed log is a `SessionLogError`.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from rtvideo.core import protocol
from rtvideo.core.chunks import EVENT_FRAME_OFFSETS, MEDIA
from rtvideo.core.errors import ErrorCode, ProtocolError
from rtvideo.core.interaction.parse import parse_interaction
from rtvideo.core.interaction.types import InteractionRequest
from rtvideo.core.rebuild import Rebuild, ScriptedEvent

#: `session.start` fields that are the proxy's (recording, branching, sharing), not the session's
PROXY_START_FIELDS = ("record", "from_recording", "steerable", "watchable", "rebuild")


class SessionLogError(ValueError):
    """The lines are not a usable session event log; the message says why."""


@dataclass(frozen=True)
class SessionLog:
    """What a recorded session was: its start, its configuration and its effective events."""

    #: the `session.start` as recorded (in), without its `type`
    start_fields: dict[str, Any]
    #: the `video.start` `config` the model answered with (its resolved values, `seed` included)
    config: dict[str, Any]
    #: the interactions that started, in the order received (sorted by chunk, stably)
    events: tuple[ScriptedEvent, ...]
    #: media chunks in the log, and their frames (`num_frames` summed)
    chunks: int
    frames: int
    #: frames of each media chunk, by generation chunk index
    chunk_frames: dict[int, int] = field(default_factory=dict)
    #: `video.start`'s `branched_from` when the session was itself a branch
    branched_from: Mapping[str, Any] | None = None

    @property
    def seed(self) -> int:
        return int(self.config["seed"])

    def start_message(self) -> dict[str, Any]:
        """The `session.start` that starts the same session again: the recorded fields without
        the proxy's own, with the seed it ran with (a random seed is pinned)."""
        fields = {k: v for k, v in self.start_fields.items() if k not in PROXY_START_FIELDS}
        return {"type": protocol.START, **fields, "seed": self.seed}

    def rebuild(self, generation_chunk_index: int) -> Rebuild:
        """The model's `rebuild` up to chunk N: every event that started at chunks 0..N."""
        return Rebuild(generation_chunk_index, tuple(e for e in self.events if e.chunk <= generation_chunk_index))

    def built_in(self) -> bool:
        """Whether the built-in generator made it: its `config` has no `sampling` (every other
        generator's does, docs/protocol.md §3.2)."""
        return "sampling" not in self.config and "model_rules" not in self.config


def parse_lines(text: str) -> list[dict[str, Any]]:
    """`events.jsonl` text as its objects (blank lines skipped)."""
    return list(iter_lines(text.splitlines()))


def iter_lines(lines: Iterable[str | bytes]) -> Iterator[dict[str, Any]]:
    """`events.jsonl` lines as their objects, one at a time (blank lines skipped): a log is read
    as a stream, never held whole."""
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except ValueError as exc:
            raise SessionLogError(f"line {number} is not JSON: {exc}") from None
        if not isinstance(value, dict) or not isinstance(value.get("message"), dict):
            raise SessionLogError(f"line {number} is not a {{t, dir, message}} object")
        yield value


def read_log(lines: Iterable[Mapping[str, Any]]) -> SessionLog:
    """A `SessionLog` from a recording's event log lines (module docstring)."""
    start: dict[str, Any] | None = None
    config: dict[str, Any] | None = None
    branched: Mapping[str, Any] | None = None
    pending: dict[str, deque[InteractionRequest]] = {}  # sent with an id, not yet answered
    anonymous: deque[InteractionRequest] = deque()  # sent without an id, waiting for its ack
    applied: dict[str, InteractionRequest] = {}
    started: dict[str, tuple[int, int]] = {}  # event id -> (generation chunk, frame offset)
    chunk_frames: dict[int, int] = {}
    for line in lines:
        message, direction = line["message"], line.get("dir")
        kind = message.get("type")
        if direction == "in":
            if kind == protocol.START and start is None:
                start = {k: v for k, v in message.items() if k != "type"}
            elif kind == protocol.INTERACTION:
                request = _interaction(message)
                if request is None:
                    continue
                if request.event_id is None:
                    anonymous.append(request)
                else:
                    pending.setdefault(request.event_id, deque()).append(request)
            continue
        if kind == protocol.VIDEO_START and config is None:
            if not isinstance(message.get("config"), dict):
                raise SessionLogError("video.start has no config")
            config = dict(message["config"])
            branched = message.get("branched_from")
        elif kind == protocol.QUEUED and isinstance(message.get("event_id"), str):
            event_id = message["event_id"]
            waiting = pending.get(event_id)
            if waiting:
                request = waiting.popleft()
            elif event_id not in applied and anonymous:
                request = anonymous.popleft()  # a server-generated id
            else:
                continue
            applied.setdefault(event_id, request)
        elif kind == protocol.ERROR and isinstance(message.get("event_id"), str):
            if message.get("code") != ErrorCode.INTERACTION_FAILED.value:  # that one answers an acked event
                waiting = pending.get(message["event_id"])
                if waiting:
                    waiting.popleft()  # refused: never applied
        elif kind == protocol.CHUNK_METADATA and message.get("kind") == MEDIA:
            index = message.get("generation_chunk_index")
            if not isinstance(index, int) or index in chunk_frames:
                continue  # a payload repeated (a resumed connection) is the same chunk
            chunk_frames[index] = int(message.get("num_frames") or 0)
            offsets = message.get(EVENT_FRAME_OFFSETS) or {}
            for event_id in message.get("started_event_ids") or ():
                started.setdefault(event_id, (index, int(offsets.get(event_id, 0))))
    if start is None:
        raise SessionLogError("the log has no inbound session.start")
    if config is None or "seed" not in config:
        raise SessionLogError("the log has no video.start with a config and its seed")
    events = []
    for event_id, (chunk, frame) in started.items():
        request = applied.get(event_id)
        if request is None:
            raise SessionLogError(f"event {event_id!r} started at chunk {chunk}, but no acked message sent it")
        if request.event_id != event_id:
            request = request.__class__(
                request.event, event_id, request.transition_chunks, request.interpolation, request.parts
            )
        events.append(ScriptedEvent(chunk, frame, request))
    order = {event_id: number for number, event_id in enumerate(applied)}  # the order acked = received
    events.sort(key=lambda e: (e.chunk, order[e.event_id]))
    return SessionLog(
        start_fields=start,
        config=config,
        events=tuple(events),
        chunks=len(chunk_frames),
        frames=sum(chunk_frames.values()),
        chunk_frames=chunk_frames,
        branched_from=branched,
    )


def _interaction(message: Mapping[str, Any]) -> InteractionRequest | None:
    """A recorded `session.interaction`, parsed as the model parsed it (None: it was refused)."""
    try:
        return parse_interaction(message)
    except ProtocolError:
        return None
