"""A session's event desk: admission of interactions, and the book of which end each event reached.

Apart from the worker (`session.py`) because the request path lives here: an interaction is
admitted, acked and handed to the source under this desk's lock alone, never waiting for a
chunk's send. The book (`EventBook`) is the only origin of `session.done`'s lists; an
interaction is acked before the source sees it, so no chunk metadata can name an event
ahead of its ack.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from rtvideo.backend.runtime.endings import ended_error
from rtvideo.backend.runtime.ports import Channel, Metrics
from rtvideo.backend.runtime.sources import ChunkSource, FailedEvent, Interaction
from rtvideo.core import server_messages
from rtvideo.core.errors import ProtocolError
from rtvideo.core.event_book import EventBook, Outcome
from rtvideo.core.interaction.refusal import interaction_refusal
from rtvideo.core.interaction.types import InteractionRequest
from rtvideo.core.session_config import SessionConfig
from rtvideo.core.transitions import ChunkPlan

log = logging.getLogger(__name__)


class EventDesk:
    """Owns a session's state lock, its event book and its ended flag.

    `lock` is the session's state lock: the book, the ended flag, and admission into the
    source. Lock order is always the session's stream lock, then this one, never the other
    way round, and neither while the manager's lock is held. The request path (acks) takes
    only this one, so an ack never waits for a chunk's send. `ended` is set holding both
    (`end`, called with the stream lock held), so holding either is enough to read it; once
    it is set the book no longer changes.
    """

    def __init__(self, *, request_id: str, config: SessionConfig, source: ChunkSource, metrics: Metrics) -> None:
        self._request_id = request_id
        self._config = config
        self._source = source
        self._metrics = metrics
        self._book = EventBook()
        self.lock = threading.Lock()
        self._ended = False
        self._know_named(config)

    def _know_named(self, config: SessionConfig) -> None:
        """A rebuild's named events (a moved session's own: rtvideo.core.rebuild) are this
        session's, started before its first chunk: a retry of one is acked, never applied again."""
        for event in config.rebuild.named if config.rebuild is not None else ():
            self._book.admit(event.event_id, event.request.fingerprint)
            self._book.acked(event.event_id)
            self._book.chunk(started=[event.event_id])

    @property
    def ended(self) -> bool:
        return self._ended

    def end(self) -> bool:
        """Mark the session ended (call holding the stream lock); False when it already was."""
        with self.lock:
            if self._ended:
                return False
            self._ended = True
            return True

    def admit(self, request: InteractionRequest, reply: Channel, received: float | None) -> FailedEvent | None:
        """Admit (the idempotency rule), ack on the request's own stream, then queue for the next boundary.

        Admission and the ended check are one step under the state lock, so an event is
        either admitted before the session's end is computed, and so reaches an end in
        `session.done`, or refused because the session has ended. Returns the failure of an
        event acked but refused (`interaction_refusal`, the one place that decides it, from the
        generator's `config.interactions` and the engine's pipeline rules), which the session
        sends as its error (`interaction_failed`).
        """
        received = time.monotonic() if received is None else received
        request = request.with_event_id()
        event_id = request.event_id
        assert event_id is not None
        refusal = interaction_refusal(request, self._config.interactions, self._config.pipeline_interactions)
        with self.lock:
            if self._ended:
                reply.send(ended_error(self._request_id), final=True)
                return None
            try:
                new = self._book.admit(event_id, request.fingerprint)
            except ProtocolError as exc:
                self._metrics.count_interaction(exc.code.value)
                reply.send(server_messages.error_from(exc, self._request_id), final=True)
                log.info("request_id=%s event_id=%s rejected: %s", self._request_id, event_id, exc)
                return None
            try:
                reply.send(server_messages.queued(self._request_id, event_id, self._received_at(received)), final=True)
                self._book.acked(event_id)
            except Exception:  # noqa: BLE001 - admitted ids must be applied, or a retry would skip them
                log.warning("request_id=%s event_id=%s ack not delivered", self._request_id, event_id)
            ack_seconds = time.monotonic() - received
            self._metrics.observe_ack(ack_seconds)
            if not new:
                self._metrics.count_interaction("retry")
                log.info("request_id=%s event_id=%s retry acked again", self._request_id, event_id)
                return None
            if refusal is None:
                interaction = Interaction.admitted(
                    request,
                    event_id,
                    prompt_default=self._config.default_transition_chunks,
                    received_at=received,
                    interpolation_default=self._config.interpolation,
                )
                self._source.admit_event(interaction)  # the one way every source takes events
                self._metrics.count_interaction("queued")
                log.info(
                    "request_id=%s event_id=%s queued transition_chunks=%s ack_ms=%.2f",
                    self._request_id,
                    event_id,
                    dict(interaction.chunks),
                    ack_seconds * 1e3,
                )
                return None
        log.info("request_id=%s event_id=%s refused: %s", self._request_id, event_id, refusal.message)
        return FailedEvent(event_id, refusal.message, refusal.code)

    def _received_at(self, received: float) -> float | None:
        """A paced session's ack carries when the interaction arrived (vLLM-Omni 0.32's
        `received_at`), on the wall clock: `received` is this host's monotonic clock."""
        if self._config.streaming_pacing is None:
            return None
        return time.time() - (time.monotonic() - received)

    def chunk_sent(self, plan: ChunkPlan) -> None:
        """Enter a sent chunk's event lists (call holding the stream lock, right after the send)."""
        with self.lock:
            self._book.chunk(
                started=plan.started,
                completed=plan.completed,
                interrupted=plan.interrupted,
                superseded=plan.superseded,
            )

    def failed(self, event_id: str) -> bool:
        """Mark an acked event failed (call holding the stream lock); False when it already has an
        end (or the session ended, or it is unknown): then nothing is to be sent."""
        with self.lock:
            state = self._book.state(event_id)
            if self._ended or state is None or state.ended:
                return False
            self._book.failed(event_id)
            return True

    def done(self, *, chunks: int, stopped: bool) -> dict[str, Any]:
        """`session.done` with the book's lists (once ended the book no longer changes)."""
        return self._book.done(self._request_id, chunks=chunks, stopped=stopped)

    def outcome(self) -> Outcome:
        return self._book.outcome()
