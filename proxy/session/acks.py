"""The proxy's own `session.interaction.queued` (docs/protocol.md §3.1, §4).

The proxy acks a valid interaction at once, as the model would, forwards it, and drops the
model's identical ack: the ack does not wait for the two extra hops through Triton. A retry of
an event acked here (`Ack.new` false) is acked again and not forwarded: the model would apply
nothing, and after a move the new model may never have heard of it. The
decision is the model's rule on the model's inputs: validation is the one core parser
(`rtvideo.core.interaction.parse.parse_interaction`) and admission is the session's `EventBook.admit` (the
idempotency rule and the event bound), fed the same interactions in the same order (a retry
changes neither book). The acks admit through the book's one writer, the session's `Ledger`
(the `Admissions` seam), and never write the book themselves. What the proxy cannot decide
alone (an invalid interaction, a conflict, the session's event limit, an id the book knows
only from an ack it observed) is forwarded unacked and answered by the model.

An interaction acked here that the model refuses (it raced the session's end) needs no
repair: it is an acked event that no chunk started, so every `session.done` the client gets
lists it as unapplied (rtvideo.proxy.session.ledger). `answered` tells the session which of the
model's answers to drop, and which were such refusals (counted).

Pure (no I/O): the session feeds it and acts on what it returns.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from rtvideo.core import protocol
from rtvideo.core.errors import ProtocolError
from rtvideo.core.event_book import UnknownPayload
from rtvideo.core.interaction.parse import parse_interaction
from rtvideo.core.rebuild import interaction_message


@dataclass(frozen=True)
class Ack:
    """An interaction the proxy acks now."""

    event_id: str
    raw: bytes  # what goes to the model and the store: the canonical frame (`interaction_message`), its id filled in
    new: bool  # False: a retry (acked again, applied once)


class Answer(enum.Enum):
    """What the model's answer to a forwarded request means here."""

    NOT_ACKED_HERE = enum.auto()  # the model answers it: forward the answer to the client
    ADMITTED = enum.auto()  # the model's ack, the same as the proxy's: drop it
    REFUSED = enum.auto()  # acked here, refused there (the session had ended): drop it; done lists it


class Admissions(Protocol):
    """Where the acks admit their events: the session's event book, through its one writer
    (rtvideo.proxy.session.ledger's `Ledger`)."""

    def admit(self, event_id: str, fingerprint: bytes) -> bool:
        """True: a new event, now recorded; False: a retry (`EventBook.admit`, which it raises)."""
        ...

    def retract(self, event_id: str) -> None:
        """An admission that did not hold: as if never made (`EventBook.retract`)."""


@dataclass
class ProxyAcks:
    """One session's acks: decided on its event book (`admissions`), matched to the model's answers."""

    admissions: Admissions
    _due: dict[str, str] = field(default_factory=dict)  # request tag → event id acked here, model's answer due

    def decide(self, message: Mapping[str, Any], raw: bytes) -> Ack | None:
        """The ack for a `session.interaction`, admitted to the book; None when the model must answer it."""
        try:
            request = parse_interaction(message)
        except ProtocolError:
            return None  # invalid: answered by the model, admitted by neither
        filled = request.with_event_id()  # the model must use the id the client is told
        assert filled.event_id is not None
        # What the model gets, the store keeps and a move resends: the parsed request, never the
        # client's frame (a field the parser ignores is not carried, stored or kept in memory)
        canonical = interaction_message(filled)
        if len(canonical) > protocol.MAX_MESSAGE_BYTES:
            return None  # the id would take it over the model's size limit: the model names it
        try:
            new = self.admissions.admit(filled.event_id, filled.fingerprint)
        except (ProtocolError, UnknownPayload):
            return None  # a conflict, the session's limit, or a payload unknown here: the model answers
        return Ack(filled.event_id, canonical, new)

    def unkept(self, ack: Ack) -> None:
        """A new event the store could not keep: refused, never forwarded; as if never admitted."""
        self.admissions.retract(ack.event_id)

    def restored(self, raw: bytes) -> str | None:
        """An interaction another proxy admitted (and stored before its ack left) is admitted
        here too, so a retry of it is acked again and not applied twice (a takeover). Returns
        its event id once admitted (None: it could not be read or admitted)."""
        try:
            request = parse_interaction(json.loads(raw))
        except (ValueError, ProtocolError):
            return None
        if request.event_id is None:
            return None
        try:
            self.admissions.admit(request.event_id, request.fingerprint)
        except (ProtocolError, UnknownPayload):
            return None
        return request.event_id

    def forwarded(self, tag: str, ack: Ack) -> None:
        """The acked interaction went to the model as request `tag`."""
        self._due[tag] = ack.event_id

    def answered(self, tag: str, message: Mapping[str, Any]) -> Answer:
        """The model's one answer to request `tag`."""
        event_id = self._due.pop(tag, None)
        if event_id is None:
            return Answer.NOT_ACKED_HERE
        if message.get("type") == protocol.QUEUED and message.get("event_id") == event_id:
            return Answer.ADMITTED
        return Answer.REFUSED
