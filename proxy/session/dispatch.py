"""What goes to a session's owner, and when (docs/protocol.md §3.1, §7).

Triton's replies for a client (the upstream drops the rest) and the proxy's own answers (pongs,
acks, errors about one message) go through the session's `OutboundOrder`, which holds a chunk
until the acks it names went out, and answers until video.start did. `Dispatch` feeds it, drops
the model's answers to interactions the proxy acked itself, keeps the ordering's one timer,
bounds the answers held for video.start like the outbound buffer, and writes each released item
to the owner's seat, in order, until the end is claimed (what a video.start or a session.done
means is the session's: `DispatchedSession`). A guest steerer's answers take the same ordering,
so a chunk naming its event still waits for its ack, but are written to the guest alone: the
proxy's own answers carry their recipient, the model's are routed by request tag, an
`interaction_failed` on the start stream by the event id it names (its first sender's).

## The order (OutboundOrder)

Triton may interleave the responses of different requests on one gRPC stream, so the proxy
keeps two rules: nothing precedes `video.start` (an answer to a later request that overtook it
waits behind it); no message names an event before its ack (a start-stream message naming an
event whose ack has not been written waits, in order, until the ack passes: it is on its way,
the event was admitted; still, each waits at most `ack_wait` seconds from its own arrival).
Answers may overtake queued video (they are small and a client waits for them), but only once
`video.start` was handed to the socket: until then the writer could put them ahead of it.

Pure (no I/O, no asyncio, time passed in) so that it can be tested alone; the session
writes what each call returns and arms one timer for `deadline`.

## The proxy's own acks (ProxyAcks)

The proxy's own `session.interaction.queued` (docs/protocol.md §3.1, §4).

The proxy acks a valid interaction at once, as the model would, forwards it, and drops the
model's identical ack: the ack does not wait for the two extra hops through Triton. A retry of
an event acked here (`Ack.new` false) is acked again and not forwarded: the model would apply
nothing, and after a move the new model may never have heard of it. The
decision is the model's rule on the model's inputs: validation is the one core parser
(`rtvideo.core.interaction.parse.parse_interaction`) and admission is the session's `EventBook.admit` (the
idempotency rule and the event bound), fed the same interactions in the same order (a retry
changes neither book). What the proxy cannot decide alone (an invalid interaction, a conflict,
the session's event limit, an id the book knows only from an ack it observed) is forwarded
unacked and answered by the model.

An interaction acked here that the model refuses (it raced the session's end) needs no
repair: it is an acked event that no chunk started, so every `session.done` the client gets
lists it as unapplied (rtvideo.proxy.session.ledger). `answered` tells the session which of the
model's answers to drop, and which were such refusals (counted).

Pure (no I/O): the session feeds it and acts on what it returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from rtvideo.core import protocol, server_messages
from rtvideo.core.chunks import mentioned_event_ids
from rtvideo.core.errors import ErrorCode, ProtocolError
from rtvideo.core.event_book import EventBook, UnknownPayload
from rtvideo.core.interaction.parse import parse_interaction
from rtvideo.core.rebuild import interaction_message
from rtvideo.proxy.observability.metrics import ProxyMetrics
from rtvideo.proxy.observability.session_timing import PlayheadTiming
from rtvideo.proxy.participants.links import Guest, OwnerSeat
from rtvideo.proxy.session.lifecycle import SessionPhase
from rtvideo.proxy.session.limits import RecentIds
from rtvideo.triton.wire import START_TAG, Reply

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OwnAnswer:
    """An answer the proxy writes itself (pong, ack, error about one message). Built when it is
    written, so that an answer held behind video.start names the request."""

    build: Callable[[], Mapping[str, Any]]
    received: float | None = None  # an ack's: when the client's frame arrived (perf_counter)
    to: Guest | None = None  # None: the owner


@dataclass(frozen=True)
class Routed:
    """The model's answer to a request a guest steerer sent: written to that guest alone."""

    reply: Reply
    to: Guest


Item = Reply | OwnAnswer | Routed


class DispatchedSession(Protocol):
    """What the session does when its owner (or a guest) is written certain messages
    (`ProxySession` implements it)."""

    def started(self, message: dict[str, Any], text: str) -> tuple[dict[str, Any], str]:
        """The model's video.start → what the owner is handed (with its tokens)."""
        ...

    def model_done(self) -> None:
        """The model's session.done was queued for the owner."""

    def slow_consumer(self) -> None:
        """The owner reads too slowly: more than the outbound bound waits."""

    def told_guest(self, message: Mapping[str, Any], guest: Guest) -> None:
        """A message written to a guest steerer, not the owner: the session's book sees it as
        the owner's ledger sees what the owner is handed (acks, interaction_failed), and the
        recording hears it."""


class Dispatch:
    """One session's outbound ordering, its ack-wait timer, and the bound on early answers."""

    def __init__(
        self,
        life: SessionPhase,
        ack_wait: float,
        bound: int,
        seat: OwnerSeat,
        acks: ProxyAcks,
        metrics: ProxyMetrics,
        playhead: PlayheadTiming,
        session: DispatchedSession,
    ) -> None:
        self._life = life
        self._order: OutboundOrder[Item] = OutboundOrder(ack_wait=ack_wait)
        self._bound = bound  # bytes of answers held for video.start (the outbound buffer's bound)
        self._seat = seat
        self._acks = acks
        self._metrics = metrics
        self._playhead = playhead
        self._session = session
        self._ack_due: dict[str, float] = {}  # request tag → when its interaction arrived (the model acks it)
        self._routes: dict[str, Guest] = {}  # request tag → the guest steerer that sent it
        self._senders: dict[str, Guest | None] = {}  # event id → whom it was first acked to (None: owner)
        self._timer: asyncio.TimerHandle | None = None

    def ack_due(self, tag: str, received: float, to: Guest | None = None) -> None:
        """The interaction that arrived at `received` went to the model as request `tag`; its ack
        is the model's (timed when it goes out), and goes to `to` (None: the owner)."""
        self._ack_due[tag] = received
        self.route(tag, to)

    def route(self, tag: str, to: Guest | None) -> None:
        """The model's answer to request `tag` goes to `to` (None: the owner, as ever)."""
        if to is not None:
            self._routes[tag] = to

    def received(self, reply: Reply, *, answers_stop: bool) -> None:
        """A reply for a client (`answers_stop`: to the request that carried sequence_end)."""
        message = reply.message
        assert message is not None  # the upstream passes on only replies that carry one
        to = self._routes.pop(reply.tag, None)
        answer = self._acks.answered(reply.tag, message)
        if answer is Answer.REFUSED:
            self._metrics.acks_refused.inc()
            log.info(
                "request_id=%s an interaction acked by the proxy was refused by the model (%s); "
                "session.done lists it as unapplied",
                self._life.request_id,
                reply.text[:200],
            )
        if answer is not Answer.NOT_ACKED_HERE:
            return  # the client had its ack from the proxy
        if answers_stop or not self._life.live:
            return  # the answer to session.stop is the trailer and session.done, not this
        if reply.tag == START_TAG:
            self._deliver(self._order.stream(reply, message, time.monotonic()))
        else:  # the answer to one later request (ack, pong, per-message error)
            ack = message["event_id"] if message.get("type") == protocol.QUEUED else None
            item: Item = reply if to is None else Routed(reply, to)
            self._deliver(self._order.answer(item, len(reply.text) + len(reply.data), ack))

    def answer(
        self,
        build: Callable[[], Mapping[str, Any]],
        *,
        ack: str | None = None,
        received: float | None = None,
        to: Guest | None = None,
    ) -> None:
        """An answer of the proxy's own, ordered and bounded like any reply; `ack`: the event id
        it acknowledges; `to`: the guest steerer it answers (None: the owner)."""
        answer = OwnAnswer(build, received, to)
        self._deliver(self._order.answer(answer, len(server_messages.encode(build())), ack))

    def reject(self, code: ErrorCode, text: str, event_id: str | None = None, to: Guest | None = None) -> None:
        """An error about one client message (`event_id`: the event it names; `to`: the guest
        steerer that sent it, None: the owner); the session goes on."""
        life = self._life
        self.answer(lambda: server_messages.error(code, text, request_id=life.request_id, event_id=event_id), to=to)

    def handed_out(self, message: Mapping[str, Any]) -> None:
        """The owner's socket took this message."""
        self._order.handed_out(message)

    def taken_over(self, acked: Iterable[str]) -> None:
        """The session was taken over: what the replica before handed out (`OutboundOrder.taken_over`)."""
        self._order.taken_over(acked)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def _write(self, send: Send[Item]) -> None:
        """One item the ordering released: a reply goes on, an answer of the proxy's own is built."""
        if isinstance(send.item, Reply):
            self._forward(send.item, send.urgent)
        elif isinstance(send.item, Routed):
            self._aside(send.item.to, send.item.reply.message or {}, send.item.reply.text, send.item.reply.tag)
        elif send.item.to is not None:
            self._aside(send.item.to, message := send.item.build())
            if send.item.received is not None:
                self._acked(message, send.item.received)
        elif not self._seat.emit(message := send.item.build(), urgent=send.urgent):
            self._session.slow_consumer()
        elif send.item.received is not None:
            self._note_sender(message, None)
            self._acked(message, send.item.received)

    def _forward(self, reply: Reply, urgent: bool) -> None:
        message = reply.message
        assert message is not None  # `received` passes on only replies that carry one
        kind = message.get("type")
        received = self._ack_due.pop(reply.tag, None)
        text = reply.text
        on_stream = reply.tag == START_TAG and kind == protocol.ERROR  # interaction_failed, decided after the ack
        guest = self._senders.get(message.get("event_id") or "") if on_stream else None
        if guest is not None:  # about a guest's event: its sender's alone
            self._aside(guest, message, text)
            return
        if kind == protocol.VIDEO_START:
            message, text = self._session.started(message, text)
        data = reply.data if kind == protocol.CHUNK_METADATA else None
        if not self._seat.emit(message, text=text, data=data, urgent=urgent):
            self._session.slow_consumer()
        elif kind == protocol.DONE:
            self._session.model_done()
        if kind == protocol.QUEUED:
            self._note_sender(message, None)
            if received is not None:
                self._acked(message, received)

    def _aside(self, to: Guest, message: Mapping[str, Any], text: str | None = None, tag: str | None = None) -> None:
        """A message for a guest steerer alone; the session's book sees it (its acks count)."""
        self._note_sender(message, to)
        self._session.told_guest(message, to)
        to.answer(message, text)
        received = self._ack_due.pop(tag, None) if tag is not None else None
        if received is not None and message.get("type") == protocol.QUEUED:
            self._acked(message, received)

    def _note_sender(self, message: Mapping[str, Any], to: Guest | None) -> None:
        if message.get("type") == protocol.QUEUED:
            self._senders.setdefault(message["event_id"], to)

    def _acked(self, message: Mapping[str, Any], received: float) -> None:
        self._metrics.ack_latency_seconds.observe(time.perf_counter() - received)
        self._playhead.sent(message["event_id"], received)
        log.debug("request_id=%s event_id=%s queued", self._life.request_id, message["event_id"])

    def _deliver(self, sends: list[Send[Item]]) -> None:
        """Write what the ordering released, in order, until the end is claimed (a refused
        write, session.done)."""
        if self._order.early_bytes > self._bound:
            self._session.slow_consumer()
        for send in sends:
            if not self._life.live:
                return
            self._write(send)
        if self._life.live:
            self._arm()

    def _arm(self) -> None:
        """One timer, for the ordering's deadline. The deadline only moves later while it is armed,
        so firing early at worst finds nothing due and re-arms."""
        deadline = self._order.deadline
        if deadline is not None and self._timer is None:
            delay = max(0.0, deadline - time.monotonic())
            self._timer = asyncio.get_running_loop().call_later(delay, self._wait_over)

    def _wait_over(self) -> None:
        self._timer = None
        released = self._order.expire(time.monotonic())
        if released:
            log.warning(
                "request_id=%s released %d message(s) whose ack did not arrive in %.1f s",
                self._life.request_id,
                len(released),
                self._order.ack_wait,
            )
        self._deliver(released)


T = TypeVar("T")


def named_event_ids(message: Mapping[str, Any]) -> set[str]:
    """Event ids a start-stream message refers to (each was acked on another stream)."""
    kind = message.get("type")
    if kind == protocol.CHUNK_METADATA:
        return mentioned_event_ids(dict(message))
    if kind == protocol.ERROR and message.get("event_id"):
        return {message["event_id"]}  # interaction_failed: decided after the ack
    if kind == protocol.DONE:
        return set(message.get("unapplied_event_ids") or ()) | set(message.get("unfinished_event_ids") or ())
    return set()


@dataclass(frozen=True)
class Send(Generic[T]):
    """One item to write now; `urgent`: it may overtake queued video."""

    item: T
    urgent: bool = False


@dataclass(frozen=True)
class _Held(Generic[T]):
    """A start-stream message waiting for acks (or for the one ahead of it)."""

    item: T
    names: frozenset[str]
    arrived: float
    opens: bool  # it is video.start


@dataclass(frozen=True)
class _Early(Generic[T]):
    """An answer that came before video.start."""

    item: T
    size: int
    ack: str | None


@dataclass
class OutboundOrder(Generic[T]):
    """One session's ordering state: feed it every message, write what it returns, in order."""

    #: the longest a start-stream message waits for the acks it names, from its own arrival
    ack_wait: float
    #: bytes of answers waiting for video.start (the session bounds them like its outbound buffer)
    early_bytes: int = field(default=0, init=False)
    _started: bool = field(default=False, init=False)  # video.start was returned
    _start_taken: bool = field(default=False, init=False)  # ... and handed to the socket
    _early: list[_Early[T]] = field(default_factory=list, init=False)
    _acked: RecentIds = field(default_factory=RecentIds, init=False)  # bounded: see RecentIds
    _held: deque[_Held[T]] = field(default_factory=deque, init=False)  # in arrival order
    _overdue: int = field(default=0, init=False)  # held messages at the front that go regardless of acks

    @property
    def acked(self) -> RecentIds:
        """The events whose ack was handed out (the most recent, bounded)."""
        return self._acked

    def stream(self, item: T, message: Mapping[str, Any], now: float) -> list[Send[T]]:
        """A message on the start request's stream (video.start, chunks, session.done, ...)."""
        names = frozenset(named_event_ids(message))
        self._held.append(_Held(item, names, now, opens=message.get("type") == protocol.VIDEO_START))
        return self._flow()

    def answer(self, item: T, size: int, ack: str | None = None) -> list[Send[T]]:
        """The answer to one later request; `ack`: the event id it acknowledges (`queued`)."""
        if not self._started:
            self._early.append(_Early(item, size, ack))
            self.early_bytes += size
            return []
        return self._answered(item, ack)

    def handed_out(self, message: Mapping[str, Any]) -> None:
        """The writer handed this message to the socket."""
        if message.get("type") == protocol.VIDEO_START:
            self._start_taken = True

    def taken_over(self, acked: Iterable[str]) -> None:
        """A session taken over from another replica: its video.start and the acks of `acked`
        were handed out there (the new stream's own video.start never reaches the client)."""
        self._started = self._start_taken = True
        for event_id in acked:
            self._acked.add(event_id)

    @property
    def deadline(self) -> float | None:
        """When the oldest held message stops waiting for its acks (None: nothing held)."""
        return min(h.arrived for h in self._held) + self.ack_wait if self._held else None

    def expire(self, now: float) -> list[Send[T]]:
        """Held messages whose wait is over go now, with everything ahead of them (order is
        kept) and whatever behind them was waiting only for them."""
        due = [i for i, held in enumerate(self._held) if held.arrived + self.ack_wait <= now]
        if not due:
            return []
        self._overdue = due[-1] + 1
        return self._flow()

    def _flow(self) -> list[Send[T]]:
        """The held messages that may go now, from the front, in order."""
        sends: list[Send[T]] = []
        while self._held and (self._overdue or self._acked.issuperset(self._held[0].names)):
            self._overdue = max(0, self._overdue - 1)
            held = self._held.popleft()
            sends.append(Send(held.item))
            if held.opens and not self._started:
                sends += self._start()
        return sends

    def _start(self) -> list[Send[T]]:
        """video.start goes: the answers that waited for it follow, in arrival order."""
        self._started = True
        early, self._early, self.early_bytes = self._early, [], 0
        sends: list[Send[T]] = []
        for answer in early:
            sends += self._answered(answer.item, answer.ack)
        return sends

    def _answered(self, item: T, ack: str | None) -> list[Send[T]]:
        sends = [Send(item, urgent=self._start_taken)]
        if ack is not None:
            self._acked.add(ack)
            sends += self._flow()
        return sends


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


@dataclass
class ProxyAcks:
    """One session's acks: decided on its `EventBook`, matched to the model's answers."""

    book: EventBook = field(default_factory=EventBook)
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
            new = self.book.admit(filled.event_id, filled.fingerprint)
        except (ProtocolError, UnknownPayload):
            return None  # a conflict, the session's limit, or a payload unknown here: the model answers
        return Ack(filled.event_id, canonical, new)

    def unkept(self, ack: Ack) -> None:
        """A new event the store could not keep: refused, never forwarded; as if never admitted."""
        self.book.retract(ack.event_id)

    def restored(self, raw: bytes) -> None:
        """An interaction another proxy admitted (and stored before its ack left) is admitted
        here too, so a retry of it is acked again and not applied twice (a takeover)."""
        try:
            request = parse_interaction(json.loads(raw))
        except (ValueError, ProtocolError):
            return
        if request.event_id is not None:
            with contextlib.suppress(ProtocolError, UnknownPayload):
                self.book.admit(request.event_id, request.fingerprint)

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
