"""What a move needs to start a session again on another Triton: its start, its seed, and each
of its events with the chunk and frame where it took effect (docs/recordings.md "Moves").

The built-in generator's session is a pure function of those (rtvideo.core.rebuild), so the
model rebuilds it at the next chunk the proxy has not received and streams on from there. An
engine's (vLLM-Omni's) cannot be rebuilt: its move is the approximation of
rtvideo.core.approximation, from the last frame sent, with the events in progress at the cut
(the last chunk's active ones it did not complete) marked `open`. The
log is fed on the proxy's side of the sequence: the start as sent to the model, each
interaction as forwarded (its id filled in), and what Triton answered (the `video.start`
config with its seed, each media chunk's started events and their frame offsets). It keeps
only that: an event's first forwarded payload (the one admitted: a different payload under the
same id is refused) and the chunk it started in, so it grows with events, not with chunks.

What it keeps of an event is the parsed request, as bounded as parsing makes it (what the model
got: `rebuild.interaction_message`), and only for an event the session's `EventBook` admitted: an
interaction the model refuses (invalid, a conflict, past the session's event bound) is never
kept, and one refused after its ack (`interaction_failed`) is forgotten unless it started. Its
size is counted as that canonical frame's; past `max_bytes` the log forgets every payload and
the session can no longer move (`movable` says why), so one session's events never hold more
than that much of the proxy's memory.

Pure (no I/O): the session feeds it and asks it for a start.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from rtvideo.core import protocol
from rtvideo.core.approximation import approximate_start
from rtvideo.core.chunks import EVENT_FRAME_OFFSETS, MEDIA
from rtvideo.core.errors import ErrorCode, ProtocolError
from rtvideo.core.interaction.parse import parse_interaction
from rtvideo.core.interaction.types import InteractionRequest
from rtvideo.core.rebuild import REBUILD, Rebuild, ScriptedEvent, interaction_message, parse_rebuild

#: `config` fields only a generator whose state cannot be rebuilt reports (docs/protocol.md §3.2)
_ENGINE_CONFIG = ("sampling", "model_rules")


class Admitted(Protocol):
    """What the move log reads of the session's event book (a read-only view of it)."""

    def holds(self, event_id: str, fingerprint: bytes) -> bool:
        """Whether `event_id` was admitted with this payload (`EventBook.holds`)."""
        ...


class Unmovable(Exception):
    """The session cannot be started again elsewhere; the message says why."""


class MoveLog:
    """One session's start and effective events, as a move needs them (module docstring)."""

    def __init__(self, start: Mapping[str, Any], book: Admitted | None = None, max_bytes: int | None = None) -> None:
        self._book = book  # the session's admissions (None: every parsed interaction is kept)
        self._max_bytes = max_bytes  # None: unbounded
        self._bytes = 0  # the canonical size of the payloads kept in `_sent`
        self._sizes: dict[str, int] = {}  # event id -> its payload's counted size
        self._overflow: str | None = None  # why the log stopped keeping payloads (past max_bytes)
        self._start = {k: v for k, v in start.items() if k != REBUILD}
        # a branch's recorded events: history on every stream of this session
        self._history = parse_rebuild(start[REBUILD]).events if REBUILD in start else ()
        self._sent: dict[str, InteractionRequest] = {}  # event id -> its first forwarded payload
        self._started: dict[str, tuple[int, int]] = {}  # event id -> (generation chunk, frame offset)
        self._open: tuple[str, ...] = ()  # in progress at the end of the last chunk received
        self.config: dict[str, Any] | None = None

    def forwarded(self, raw: bytes) -> None:
        """A request as it went to the model; interactions are kept."""
        if protocol.INTERACTION.encode() not in raw:
            return  # a ping, a stop, a report: cheap to skip unparsed
        try:
            message = json.loads(raw)
            request = parse_interaction(message)
        except (ValueError, ProtocolError):
            return  # refused by the model: it changed nothing
        event_id = request.event_id
        if event_id is None or event_id in self._sent or self._overflow is not None:
            return  # the first payload is the admitted one
        if self._book is not None and not self._book.holds(event_id, request.fingerprint):
            return  # refused by the model (a conflict, the event bound): it changed nothing
        size = len(interaction_message(request))
        if self._max_bytes is not None and self._bytes + size > self._max_bytes:
            self._overflow = f"its events exceed the bound of {self._max_bytes} bytes kept for a move"
            self._sent.clear()
            self._sizes.clear()
            self._bytes = 0
            return
        self._sent[event_id] = request
        self._sizes[event_id] = size
        self._bytes += size

    def arrived(self, message: Mapping[str, Any]) -> None:
        """A message from Triton, on the session's coordinates (after any splice)."""
        kind = message.get("type")
        if kind == protocol.ERROR and message.get("code") == ErrorCode.INTERACTION_FAILED.value:
            self._refused(message.get("event_id"))
        elif kind == protocol.VIDEO_START and self.config is None and isinstance(message.get("config"), dict):
            self.config = dict(message["config"])
        elif kind == protocol.CHUNK_METADATA and message.get("kind") == MEDIA:
            index = message.get("generation_chunk_index")
            if not isinstance(index, int):
                return
            offsets = message.get(EVENT_FRAME_OFFSETS) or {}
            for event_id in message.get("started_event_ids") or ():
                self._started.setdefault(event_id, (index, int(offsets.get(event_id, 0))))
            completed = set(message.get("completed_event_ids") or ())
            self._open = tuple(e for e in message.get("active_event_ids") or () if e not in completed)

    def _refused(self, event_id: object) -> None:
        """An acked event the model refused (`interaction_failed`): applied nowhere, never to be
        sent again; its payload goes unless a chunk started it (a later failure)."""
        if isinstance(event_id, str) and event_id in self._sent and event_id not in self._started:
            del self._sent[event_id]
            self._bytes -= self._sizes.pop(event_id, 0)

    def movable(self) -> str | None:
        """Why this session cannot be started elsewhere, or None."""
        if self._overflow is not None:
            return self._overflow
        if self.config is None or "seed" not in self.config:
            return "the model has not started the session"
        return None

    @property
    def exact(self) -> bool:
        """Whether the model rebuilds it exactly (the built-in generator), else approximately."""
        return not any(name in (self.config or {}) for name in _ENGINE_CONFIG)

    def start_at(
        self, generation_chunk_index: int, image_url: str | None = None, frames_before: int = 0
    ) -> dict[str, Any]:
        """The `session.start` that goes on at chunk N (the seed it ran with pinned): exactly, a
        branch's history, then the session's own events, named; or approximately (not `exact`),
        from `image_url` (the last frame sent) after `frames_before` frames. Raises `Unmovable`."""
        why = self.movable()
        if why is not None:
            raise Unmovable(why)
        assert self.config is not None
        own = []
        for event_id, (chunk, frame) in self._started.items():
            request = self._sent.get(event_id)
            if request is None:
                raise Unmovable(f"event {event_id!r} started, but its payload is unknown here (a server-made id)")
            own.append(ScriptedEvent(chunk, frame, request, named=True))
        own.sort(key=lambda event: event.chunk)  # stable: the order they started within a chunk
        seed = self.config["seed"]
        if not self.exact:
            return approximate_start(
                self._start,
                seed=seed,
                at=generation_chunk_index,
                events=own,
                image_url=image_url,
                frames_before=frames_before,
                named=True,
                open_ids=self._open,
            )
        rebuild = Rebuild(generation_chunk_index, (*self._history, *own))
        return {**self._start, "seed": seed, REBUILD: rebuild.to_json()}

    def resend(self, event_ids: Iterable[str]) -> list[bytes]:
        """The interactions to send again on the new stream: acked events that no chunk started."""
        out = []
        for event_id in event_ids:
            request = self._sent.get(event_id)
            if request is not None and event_id not in self._started:
                out.append(interaction_message(request))
        return out
