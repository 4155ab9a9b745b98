"""One live session: a worker thread that streams its source's encoded chunks, paced, and ends it once.

Where chunks and their events come from is the session's `ChunkSource`
(`rtvideo/backend/runtime/sources.py`). Which end each event reached is the session's
`EventBook`, fed with what is admitted, acked, failed and actually sent; it is the only
origin of `session.done`'s lists. An interaction is acked before the source sees it, so
no chunk metadata can name an event ahead of its ack. How a session ends, and what each
end sends, is `EndReason`.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rtvideo.backend.runtime.playback_clock import PlaybackClock
from rtvideo.backend.runtime.ports import Channel, Metrics
from rtvideo.backend.runtime.sources import (
    ChunkSource,
    FailedEvent,
    Interaction,
    SourceChunk,
    source_modalities,
)
from rtvideo.backend.runtime.tracing import chunk_sent
from rtvideo.core import server_messages
from rtvideo.core.chunks import chunk_timing, media_metadata, trailer_metadata
from rtvideo.core.errors import ErrorCode, ProtocolError
from rtvideo.core.event_book import EventBook
from rtvideo.core.pacing import PacingPolicy, PlayheadPacer, ReportClamp
from rtvideo.core.protocol import InteractionRequest, PlaybackReport
from rtvideo.core.session_config import SessionConfig

log = logging.getLogger(__name__)


#: the longest a session stays paused (a proxy's resume grace is far shorter); then it goes on
MAX_PAUSE_SECONDS = 600.0
#: how often a paused worker looks for a stop, a cancellation or the end
PAUSE_POLL_SECONDS = 0.2


def ended_error(request_id: str | None) -> dict[str, Any]:
    """The answer to a request that arrives after the session ended (or never started)."""
    if request_id is None:
        return server_messages.error(ErrorCode.INVALID_MESSAGE, "this sequence has no running session")
    return server_messages.error(ErrorCode.INVALID_MESSAGE, "the session has ended", request_id=request_id)


class EndReason(enum.Enum):
    """How a session ended, and what that end implies (docs/protocol.md §2.3, §7).

    Each member is (label, stopped, sends, error): the `rtvideo_session_ends_total` reason
    label; `session.done`'s `stopped`; whether anything is sent (else the start request
    completes flags-only); the code of the `error` sent before `session.done`. The ends
    the worker reaches itself (complete, limit, stopped) send the trailer first; a failure
    sends none. Not a wire concept: the wire carries only its consequences.
    """

    COMPLETE = ("complete", False, True, None)  # the session's num_frames are out
    LIMIT = ("limit", False, True, None)  # max_session_seconds
    STOPPED = ("stopped", True, True, None)  # session.stop, sequence_end, or a new start on the sequence
    CANCELLED = ("cancelled", False, False, None)  # the client cancelled the stream: nothing can reach it
    GENERATION_FAILED = ("generation_failed", False, True, ErrorCode.GENERATION_FAILED)
    STALL_TIMEOUT = ("stall_timeout", False, True, ErrorCode.STALL_TIMEOUT)
    # no request on the sequence for Triton's idle limit: Triton dropped the sequence (SessionManager._watch)
    IDLE_TIMEOUT = ("idle_timeout", False, True, ErrorCode.IDLE_TIMEOUT)
    BACKEND_UNAVAILABLE = ("backend_unavailable", False, True, ErrorCode.BACKEND_UNAVAILABLE)  # shutdown

    def __init__(self, label: str, stopped: bool, sends: bool, error: ErrorCode | None) -> None:
        self.label = label
        self.stopped = stopped
        self.sends = sends
        self.error = error


@dataclass(frozen=True)
class Limits:
    pacing_lead_chunks: float | None
    max_session_seconds: float
    stall_timeout_seconds: float
    #: pace to the player's `session.playback` reports (False: the fixed lead only)
    playback_pacing: bool = True


@dataclass
class SessionStats:
    chunks_sent: int = 0
    frames_sent: int = 0
    last_progress: float = field(default_factory=time.monotonic)


class Session:
    """Owns a chunk source and an event book; ends exactly once (`_finish`).

    Two locks, always taken in this order, never the other way round (and never while the
    manager's lock is held):

    1. `_stream_lock`: what goes out on the start stream, in order (video.start, chunks,
       interaction_failed, the trailer, session.done), and the cancelled flag. Held across
       each of those sends.
    2. `_state_lock`: the event book, the ended flag, and admission into the source. The
       request path (acks) takes only this one, so an ack never waits for a chunk's send.

    `_ended` is set holding both, so holding either is enough to read it; once it is set
    the book no longer changes. Every wait of the worker (pacing, the source's) wakes on
    the event that ends it: a stop, the end, or a cancellation found by `poll_cancelled`.
    """

    def __init__(
        self,
        *,
        request_id: str,
        config: SessionConfig,
        channel: Channel,
        source: ChunkSource,
        limits: Limits,
        metrics: Metrics,
        on_end: Callable[[Session, EndReason], None],
    ) -> None:
        self.request_id = request_id
        self.config = config
        self.channel = channel
        self._source = source
        self._source_open = True  # until closed (once, on the worker)
        self._limits = limits
        self._metrics = metrics
        self._on_end = on_end
        self._book = EventBook()
        self.stats = SessionStats()
        self._stream_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._wake = threading.Event()  # set by a stop, a cancellation or the end: pacing waits on it
        self._stop_requested = False
        self._cancelled = False
        self._ended = False
        self._paused = False  # a detached proxy session (set_paused); read by the worker
        self._paused_since: float | None = None
        self._unpaused = threading.Event()  # set when a pause is lifted (the pause wait wakes on it)
        self._thread = threading.Thread(target=self._run, name=f"session-{request_id[-8:]}", daemon=True)
        self._clock = PlaybackClock(
            chunk_seconds=config.frames_per_chunk / config.fps,
            fps=config.fps,
            lead_chunks=limits.pacing_lead_chunks if source.pacing else None,
            pacer=self._new_pacer(),
            wake=self._wake,
            touch=self.touch,
        )

    # --- request path -------------------------------------------------------------------
    def start(self) -> None:
        with self._stream_lock:
            self.channel.send(server_messages.video_start(self.request_id, self.config.format, self.config.to_json()))
        self._thread.start()

    def abandon(self) -> None:
        """Free everything of a session whose worker never started (its start failed)."""
        with self._stream_lock, self._state_lock:
            self._ended = True
        self._release()

    @property
    def ended(self) -> bool:
        return self._ended

    def request_stop(self) -> None:
        """End after the chunk in hand (it is finished and sent, docs/protocol.md §2.3)."""
        self._stop_requested = True
        self._wake.set()

    def touch(self) -> None:
        self.stats.last_progress = time.monotonic()

    def interact(self, request: InteractionRequest, reply: Channel, received: float | None = None) -> None:
        """Admit (the idempotency rule), ack on the request's own stream, then queue for the next boundary.

        Admission and the ended check are one step under the state lock, so an event is
        either admitted before the session's end is computed, and so reaches an end in
        `session.done`, or refused because the session has ended.
        """
        received = time.monotonic() if received is None else received
        request = request.with_event_id()
        event_id = request.event_id
        assert event_id is not None
        refusal = self._refusal(request)
        with self._state_lock:
            if self._ended:
                reply.send(ended_error(self.request_id), final=True)
                return
            try:
                new = self._book.admit(event_id, request.fingerprint)
            except ProtocolError as exc:
                self._metrics.count_interaction(exc.code.value)
                reply.send(server_messages.error_from(exc, self.request_id), final=True)
                log.info("request_id=%s event_id=%s rejected: %s", self.request_id, event_id, exc)
                return
            try:
                reply.send(server_messages.queued(self.request_id, event_id), final=True)
                self._book.acked(event_id)
            except Exception:  # noqa: BLE001 - admitted ids must be applied, or a retry would skip them
                log.warning("request_id=%s event_id=%s ack not delivered", self.request_id, event_id)
            ack_seconds = time.monotonic() - received
            self._metrics.observe_ack(ack_seconds)
            if not new:
                self._metrics.count_interaction("retry")
                log.info("request_id=%s event_id=%s retry acked again", self.request_id, event_id)
                return
            if refusal is None:
                interaction = Interaction.admitted(
                    request,
                    event_id,
                    prompt_default=self.config.default_transition_chunks,
                    received_at=received,
                    interpolation_default=self.config.interpolation,
                )
                self._source.admit_event(interaction)  # the one way every source takes events
                self._metrics.count_interaction("queued")
                log.info(
                    "request_id=%s event_id=%s queued transition_chunks=%s ack_ms=%.2f",
                    self.request_id,
                    event_id,
                    dict(interaction.chunks),
                    ack_seconds * 1e3,
                )
                return
        log.info("request_id=%s event_id=%s refused: %s", self.request_id, event_id, refusal)
        self._event_failed(FailedEvent(event_id, refusal))

    def _refusal(self, request: InteractionRequest) -> str | None:
        """Why the active model applies nothing of `request` (acked, then `interaction_failed`),
        or None: an `OmniTextPrompt` field no model applies, a field or interpolation this
        generator does not take (`config.interactions`: a blend, slerp), a modality its source
        does not register (none when only its engine knows)."""
        unsupported = request.unsupported_fields
        if unsupported:
            return (
                f"event field(s) {', '.join(unsupported)} not supported by the active model; "
                "nothing of this event was applied"
            )
        support = self.config.interactions
        refusal = support.refusal(request) if support is not None else None
        accepted = source_modalities(self._source)
        missing = [] if accepted is None else [kind for kind in request.kinds if kind not in accepted]
        if refusal is None and missing:
            return (
                f"interaction modality {', '.join(map(repr, missing))} is not supported by the active model "
                f"(it registers {', '.join(sorted(accepted or ())) or 'none'}); nothing of this event was applied"
            )
        return refusal

    def fail(self, reason: EndReason, message: str) -> None:
        """End the session from any thread with `reason`'s error, then `session.done`."""
        assert reason.error is not None, reason
        self._finish(reason, message)

    def poll_cancelled(self) -> None:
        """Ask Triton whether the client cancelled the start stream, and wake the worker if
        so. The manager's watch loop calls it for every live session (the one periodic
        poll: see `SessionManager._watch`); it never waits for a send in progress."""
        if not self._stream_lock.acquire(blocking=False):
            return  # sending: asked again next round
        try:
            if not self._ended:
                self._check_cancelled()
        finally:
            self._stream_lock.release()

    # --- worker -------------------------------------------------------------------------
    def _run(self) -> None:
        """Generate until an end, free everything, then report the end: a client that has
        `session.done` may count on the session's resources being free."""
        try:
            reason = self._generate(time.monotonic())
            trailer = self._close_source()
        except Exception as exc:
            log.exception("request_id=%s generation failed", self.request_id)
            self._release()
            self._finish(EndReason.GENERATION_FAILED, f"generation failed: {type(exc).__name__}: {exc}")
            return
        if reason is not None:
            self._finish(reason, trailer=trailer)

    def _generate(self, started: float) -> EndReason | None:
        """Stream chunks until an end; None when another thread ended the session (`fail`)."""
        cfg = self.config
        while True:
            if self._ended:
                return None
            if self._cancelled:
                return EndReason.CANCELLED
            if self._stop_requested:
                return EndReason.STOPPED
            remaining = None if cfg.num_frames is None else cfg.num_frames - self.stats.frames_sent
            if remaining is not None and remaining <= 0:
                return EndReason.COMPLETE
            if self._paused:
                started += self._hold_while_paused()  # the session-length clock does not run
                continue  # the checks above again: a stop or the end may have come meanwhile
            if time.monotonic() - started >= self._limits.max_session_seconds:
                return EndReason.LIMIT
            if not self._clock.wait_turn(self.stats.chunks_sent, self.stats.frames_sent):
                continue  # woken by a stop, a cancellation or the end: the checks above say which
            frames_wanted = cfg.frames_per_chunk if remaining is None else min(cfg.frames_per_chunk, remaining)
            boundary = time.monotonic()
            item = self._source.next_chunk(frames_wanted)
            if item is None:
                continue  # interrupted: the checks above say why
            if isinstance(item, FailedEvent):
                self._event_failed(item)
                continue
            if not self._send_chunk(item):
                continue  # ended or cancelled meanwhile
            self._clock.chunk_sent(time.monotonic() - boundary)

    # --- pause (a detached proxy session: docs/triton-model.md "Pausing a session") ----------
    @property
    def paused(self) -> bool:
        """Paused and within MAX_PAUSE_SECONDS: the stall clock does not run (SessionManager._watch)."""
        since = self._paused_since
        return self._paused and since is not None and time.monotonic() - since < MAX_PAUSE_SECONDS

    def set_paused(self, paused: bool) -> None:
        """Pause at the next chunk boundary (the chunk in hand is finished and sent) or go on.
        A paused session keeps its slot and generates nothing; its stall and session-length
        clocks stand still, for at most MAX_PAUSE_SECONDS, after which it goes on by itself."""
        if paused and not self._paused:
            self._paused_since = time.monotonic()
            self._unpaused.clear()
            self._paused = True
            log.info("request_id=%s paused", self.request_id)
        elif not paused and self._paused:
            self._paused = False
            self.touch()
            self._unpaused.set()
            log.info("request_id=%s resumed", self.request_id)

    def _hold_while_paused(self) -> float:
        """Wait while paused (until lifted, a stop, a cancellation, the end or MAX_PAUSE_SECONDS);
        returns the seconds waited, which the caller takes off the session-length clock."""
        began = time.monotonic()
        while self._paused and not self._wake.is_set():
            if time.monotonic() - (self._paused_since or began) >= MAX_PAUSE_SECONDS:
                log.warning("request_id=%s paused over %g s: going on", self.request_id, MAX_PAUSE_SECONDS)
                self._paused = False
                break
            self._unpaused.wait(PAUSE_POLL_SECONDS)  # a stop sets `_wake`, seen within a poll
        self.touch()
        return time.monotonic() - began

    # --- playhead reports (session.playback: docs/protocol.md §2.6, §7 "Pacing") -------------
    def _new_pacer(self) -> PlayheadPacer | None:
        lead = self._limits.pacing_lead_chunks
        if lead is None or not self._limits.playback_pacing or not self._source.pacing:
            return None
        policy = PacingPolicy(chunk_seconds=self.config.frames_per_chunk / self.config.fps, lead_chunks=lead)
        return PlayheadPacer(policy)

    def playback(self, report: PlaybackReport, received: float | None = None) -> ReportClamp | None:
        """A playhead report from the request path: kept for the pacing (clamped, never an
        error); None when this session does not pace to reports."""
        now = time.monotonic() if received is None else received
        clamp = self._clock.report(report.position_seconds, now, self.stats.frames_sent / self.config.fps)
        if clamp is not None and clamp is not ReportClamp.NONE:
            log.debug("request_id=%s playback report clamped: %s", self.request_id, clamp.value)
        return clamp

    def _send_chunk(self, chunk: SourceChunk) -> bool:
        """Send one chunk and enter its event lists in the book; False once ended or cancelled."""
        plan, media = chunk.plan, chunk.media
        meta = media_metadata(self.request_id, self.stats.chunks_sent, plan, media.frames, len(media.payload))
        lead = self._clock.lead_seconds((self.stats.frames_sent + media.frames) / self.config.fps)
        if lead is not None:
            meta["playback_lead_seconds"] = round(lead, 3)
        if self.config.metrics:  # asked for in-band timing (docs/protocol.md §6, `timing`)
            meta["timing"] = chunk_timing(media.frames, self.config.fps, media.generate_seconds, media.encode_seconds)
        with self._stream_lock:
            if self._ended or self._cancelled:
                return False
            self.channel.send(meta, media.payload)
            with self._state_lock:
                self._book.chunk(
                    started=plan.started,
                    completed=plan.completed,
                    interrupted=plan.interrupted,
                    superseded=plan.superseded,
                )
            self.stats.chunks_sent += 1
            self.stats.frames_sent += media.frames
        self.touch()
        chunk_sent(self.channel, meta, media.generate_seconds + media.encode_seconds)  # a traced session's span
        self._metrics.observe_chunk(
            media.generate_seconds, media.encode_seconds, media.frames, len(media.payload), self.config.fps
        )
        if plan.started or plan.completed or plan.superseded or plan.interrupted:
            log.info(
                "request_id=%s chunk=%d started=%s completed=%s superseded=%s interrupted=%s",
                self.request_id,
                plan.generation_chunk_index,
                list(plan.started),
                list(plan.completed),
                list(plan.superseded),
                list(plan.interrupted),
            )
        return True

    def _event_failed(self, failure: FailedEvent) -> None:
        """`interaction_failed` for an acked event that will not be applied; the session goes on.
        The event gets exactly one end: this error, or (when the session ended first, or a
        chunk already ended it) the one the book has."""
        with self._stream_lock:
            with self._state_lock:
                state = self._book.state(failure.event_id)
                if self._ended or self._cancelled or state is None or state.ended:
                    return
                self._book.failed(failure.event_id)
            self._metrics.count_interaction("interaction_failed")
            log.info("request_id=%s event_id=%s failed: %s", self.request_id, failure.event_id, failure.why)
            self.channel.send(
                server_messages.error(
                    ErrorCode.INTERACTION_FAILED, failure.why, request_id=self.request_id, event_id=failure.event_id
                )
            )

    # --- ending -------------------------------------------------------------------------
    def _check_cancelled(self) -> bool:
        """Whether the client cancelled the start stream (call holding the stream lock, so
        nothing is sent once Triton said so). The only call of `channel.is_cancelled()`."""
        if not self._cancelled and self.channel.is_cancelled():
            self._cancelled = True
            self._wake.set()
            self._source.interrupt()
        return self._cancelled

    def _finish(self, reason: EndReason, message: str = "", trailer: bytes = b"") -> None:
        """The one way a session ends: the first call wins, later ones do nothing."""
        with self._stream_lock:
            with self._state_lock:
                if self._ended:
                    return
                self._ended = True
            self._wake.set()
            self._source.interrupt()
            quiet = not reason.sends or self._check_cancelled()
            if quiet and reason.error is None:
                reason = EndReason.CANCELLED  # a cancelled stream ended it; a failure keeps its reason
            # The slot is free before the client hears of the end: a new start right after
            # `session.done` finds room. (The manager never holds its lock into a session's.)
            self._on_end(self, reason)
            if quiet:
                self._complete_quietly()
            else:
                try:
                    if reason.error is not None:
                        self.channel.send(server_messages.error(reason.error, message, request_id=self.request_id))
                    if trailer:
                        meta = trailer_metadata(self.request_id, self.stats.chunks_sent, len(trailer))
                        self.channel.send(meta, trailer)
                        self.stats.chunks_sent += 1
                    done = self._book.done(self.request_id, chunks=self.stats.chunks_sent, stopped=reason.stopped)
                    self.channel.send(done, final=True)
                except Exception:  # noqa: BLE001 - the client may be gone; the session ends anyway
                    log.warning("request_id=%s could not send the end of the session", self.request_id)
                    self._complete_quietly()
        outcome = self._book.outcome()
        log.info(
            "request_id=%s ended reason=%s chunks=%d frames=%d unapplied=%s unfinished=%s",
            self.request_id,
            reason.label,
            self.stats.chunks_sent,
            self.stats.frames_sent,
            list(outcome.unapplied),
            list(outcome.unfinished),
        )

    def _complete_quietly(self) -> None:
        """Complete the start request without a body: Triton counts it in flight until FINAL."""
        try:
            self.channel.send(None, final=True)
        except Exception:  # noqa: BLE001 - nothing more to tell a client that left
            log.debug("request_id=%s final flag not delivered", self.request_id)

    def _close_source(self) -> bytes:
        """Close the source once; its trailer (b'' on later calls)."""
        if not self._source_open:
            return b""
        self._source_open = False
        return self._source.close()

    def _release(self) -> None:
        """Free the source (generator state and encoder, or the engine request), however the worker ended."""
        try:
            self._close_source()
        except Exception:
            log.exception("request_id=%s release failed", self.request_id)
