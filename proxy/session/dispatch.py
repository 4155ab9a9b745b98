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

The ordering's rules are rtvideo.proxy.session.ordering's; which interactions the proxy acks
itself, rtvideo.proxy.session.acks'.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from rtvideo.core import protocol, server_messages
from rtvideo.core.errors import ErrorCode
from rtvideo.proxy.observability.metrics import ProxyMetrics
from rtvideo.proxy.observability.session_timing import PlayheadTiming
from rtvideo.proxy.participants.invitations import Invitations
from rtvideo.proxy.participants.links import Guest
from rtvideo.proxy.participants.seat import OwnerSeat
from rtvideo.proxy.phase import SessionPhase
from rtvideo.proxy.session.acks import Answer, ProxyAcks
from rtvideo.proxy.session.ledger import Ledger
from rtvideo.proxy.session.ordering import OutboundOrder, Send
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
        *,
        ledger: Ledger,
        invites: Invitations,
    ) -> None:
        self._life = life
        self._order: OutboundOrder[Item] = OutboundOrder(ack_wait=ack_wait)
        self._bound = bound  # bytes of answers held for video.start (the outbound buffer's bound)
        self._seat = seat
        self._acks = acks
        self._metrics = metrics
        self._playhead = playhead
        self._session = session
        self._ledger = ledger  # the event book's writer: it sees what a guest steerer is told
        self._invites = invites  # the recording hears what a guest steerer is told
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
        self._ledger.told_guest(message)  # the book sees it as it sees what the owner is handed
        self._invites.told(message, to)
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
