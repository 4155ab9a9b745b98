"""The proxy's own `session.interaction.queued` (docs/protocol.md §3.1, §4).

An ack waited for two more process hops through the proxy than over direct gRPC (client →
proxy, Triton → proxy), each with a few ms of wake-up tail on a busy machine. The model's
answer is fully determined by what the proxy already has: the message (validated by the same
core function) and the session's earlier interactions (the same `IdempotencyRegistry`, fed
the same interactions in the same order, since every one goes on to the model). So the proxy
acks at once, forwards the interaction, and drops the model's identical ack. What the proxy
cannot decide alone (an invalid interaction, a conflict, the session's event limit) is
forwarded unacked, recorded by neither, and the model answers it as always.

One case needs care: an interaction the model gets after its session ended (it raced the
end) is refused there, yet was acked here. Such an event is listed in `session.done`'s
`unapplied_event_ids`, so that every acked event still has exactly one end.

Pure (no I/O): the session feeds it and acts on what it returns.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rtvideo.core import protocol
from rtvideo.core.errors import ProtocolError
from rtvideo.core.idempotency import IdempotencyRegistry
from rtvideo.proxy.ordering import named_event_ids


@dataclass(frozen=True)
class Ack:
    """An interaction the proxy acks now."""

    event_id: str
    raw: bytes  # what goes to the model: the client's frame, with the generated id when it had none
    new: bool  # False: a retry (acked again, applied once)


class Answer(enum.Enum):
    """What the model's answer to a forwarded request means here."""

    NOT_ACKED_HERE = enum.auto()  # forward it to the client as before
    ADMITTED = enum.auto()  # the model's ack, the same as the proxy's: drop it
    REFUSED = enum.auto()  # acked here, refused there (the session had ended): drop it; done lists it


@dataclass
class ProxyAcks:
    """One session's copy of the model's admission decisions."""

    registry: IdempotencyRegistry = field(default_factory=IdempotencyRegistry)
    _due: dict[str, str] = field(default_factory=dict)  # request tag → event id acked here, model's answer due
    _unseen: dict[str, None] = field(default_factory=dict)  # new events acked here, not yet shown admitted

    def decide(self, message: Mapping[str, Any], raw: bytes) -> Ack | None:
        """The ack for a `session.interaction`, recorded; None when the model must answer it."""
        try:
            request = protocol.validate_interaction(message)
        except ProtocolError:
            return None  # invalid: answered by the model, recorded by neither
        filled = request.with_event_id()
        assert filled.event_id is not None
        if request.event_id is None:  # the model must use the id the client is told
            interaction = {**message["interaction"], "event_id": filled.event_id}
            raw = protocol.encode({**message, "interaction": interaction}).encode("utf-8", "surrogatepass")
            if len(raw) > protocol.MAX_MESSAGE_BYTES:
                return None  # the id would take it over the model's size limit: the model names it
        try:
            new = self.registry.admit(filled.event_id, filled.fingerprint)
        except ProtocolError:
            return None  # a conflict or the session's limit: answered by the model, recorded by neither
        return Ack(filled.event_id, raw, new)

    def forwarded(self, tag: str, ack: Ack) -> None:
        """The acked interaction went to the model as request `tag`."""
        self._due[tag] = ack.event_id
        if ack.new:
            self._unseen[ack.event_id] = None

    def answered(self, tag: str, message: Mapping[str, Any]) -> Answer:
        """The model's one answer to request `tag`."""
        event_id = self._due.pop(tag, None)
        if event_id is None:
            return Answer.NOT_ACKED_HERE
        if message.get("type") == protocol.QUEUED and message.get("event_id") == event_id:
            self._unseen.pop(event_id, None)  # admitted: its end shows on the session's stream
            return Answer.ADMITTED
        return Answer.REFUSED

    def shown(self, message: Mapping[str, Any]) -> None:
        """A message of the session's stream: the events it names were admitted by the model."""
        if self._unseen:
            for event_id in named_event_ids(message):
                self._unseen.pop(event_id, None)

    def complete_done(self, message: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """The model's `session.done` with the events acked here that it never admitted added
        to `unapplied_event_ids`; None when it lists every one already.

        Every event the model admitted was named on the session's stream before its done
        (chunk metadata, `interaction_failed`) or is listed in the done, so an event still
        unseen and unlisted never reached the model's session."""
        listed = set(message.get("unapplied_event_ids") or ()) | set(message.get("unfinished_event_ids") or ())
        missing = [event_id for event_id in self._unseen if event_id not in listed]
        if not missing:
            return None
        return {**message, "unapplied_event_ids": [*(message.get("unapplied_event_ids") or ()), *missing]}
