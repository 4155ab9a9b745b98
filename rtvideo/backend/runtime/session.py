"""One live session: a worker thread that streams its source's encoded chunks, paced, and ends it once.

Where chunks and their events come from is the session's `ChunkSource`
(`rtvideo/backend/runtime/sources.py`). Which end each event reached is the session's
`EventDesk` (`admission.py`), fed with what is admitted, acked, failed and actually sent;
its book is the only origin of `session.done`'s lists. How a session ends, and what each
end sends, is `EndReason` (`endings.py`); its pause is a `PauseGate` (`pause.py`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from rtvideo.backend.runtime.admission import EventDesk
from rtvideo.backend.runtime.endings import EndReason
from rtvideo.backend.runtime.pause import PauseGate
from rtvideo.backend.runtime.playback_clock import PlaybackClock, PlayerWait
from rtvideo.backend.runtime.ports import Channel, Metrics
from rtvideo.backend.runtime.sources import ChunkSource, FailedEvent, PlayerIdle, PlayerReports, SourceChunk
from rtvideo.backend.runtime.tracing import chunk_sent
from rtvideo.core import server_messages
from rtvideo.core.chunks import chunk_timing, media_metadata, trailer_metadata
from rtvideo.core.interaction.types import InteractionRequest
from rtvideo.core.pacing import PacingPolicy, PlayheadPacer, ReportClamp
from rtvideo.core.protocol import PlaybackReport
from rtvideo.core.session_config import SessionConfig
from rtvideo.core.streaming_pacing import OUTPUT_CHUNK_INDEX, PACING, PlayheadLead

log = logging.getLogger(__name__)


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


def session_limits(config: SessionConfig, limits: Limits) -> Limits:
    """The model's limits for one session: a start's `streaming_buffer_seconds` (set only where
    the generator paces) is its lead over the player, in place of `pacing_lead_chunks`, as
    vLLM-Omni's clients mean it ("generation pauses once that far ahead of the playhead")."""
    buffer = config.streaming_buffer_seconds
    if buffer is None or limits.pacing_lead_chunks is None:
        return limits
    return replace(limits, pacing_lead_chunks=buffer * config.fps / config.frames_per_chunk)


def _playhead_pacer(config: SessionConfig, limits: Limits, source: ChunkSource) -> PlayheadPacer | None:
    """The pacer of a session that paces to its player's playhead reports, else None."""
    lead = limits.pacing_lead_chunks
    if lead is None or not limits.playback_pacing or not source.pacing:
        return None
    policy = PacingPolicy(chunk_seconds=config.frames_per_chunk / config.fps, lead_chunks=lead)
    return PlayheadPacer(policy)


def _playhead_lead(config: SessionConfig, limits: Limits, source: ChunkSource) -> PlayheadLead | None:
    """vLLM-Omni 0.32's bound over the player's reported playhead, for a session whose start
    asked for `streaming_pacing` on a generator that paces (`SessionConfig.streaming_pacing`)."""
    if config.streaming_pacing is None or limits.pacing_lead_chunks is None or not source.pacing:
        return None
    return PlayheadLead(config.streaming_pacing)


def _complete_quietly(channel: Channel, request_id: str) -> None:
    """Complete the start request without a body: Triton counts it in flight until FINAL."""
    try:
        channel.send(None, final=True)
    except Exception:  # noqa: BLE001 - nothing more to tell a client that left
        log.debug("request_id=%s final flag not delivered", request_id)


class Session:
    """Owns a chunk source and an event desk; ends exactly once (`_finish`).

    Two locks, always taken in this order, never the other way round (and never while the
    manager's lock is held):

    1. `_stream_lock`: what goes out on the start stream, in order (video.start, chunks,
       interaction_failed, the trailer, session.done), and the cancelled flag. Held across
       each of those sends.
    2. the state lock, `_desk.lock` (`EventDesk`): the event book, the ended flag, and
       admission into the source. The request path (acks) takes only this one, so an ack
       never waits for a chunk's send.

    The ended flag (`_desk.end`) is set holding both, so holding either is enough to read
    it; once it is set the book no longer changes. Every wait of the worker (pacing, the
    source's) wakes on the event that ends it: a stop, the end, or a cancellation found by
    `poll_cancelled`.
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
        limits = session_limits(config, limits)  # its own lead, where its start asked for one
        self.request_id = request_id
        self.config = config
        self.channel = channel
        self._source = source
        self._source_open = True  # until closed (once, on the worker)
        self._limits = limits
        self._metrics = metrics
        self._on_end = on_end
        self._desk = EventDesk(request_id=request_id, config=config, source=source, metrics=metrics)
        self.stats = SessionStats()
        self._stream_lock = threading.Lock()
        self._wake = threading.Event()  # set by a stop, a cancellation or the end: pacing waits on it
        self._stop_requested = False
        self._stop_at: float | None = None  # when the first stop came (`session.done`'s stop_latency_s)
        self._end_message = ""  # the error text of an end the worker reached itself
        self._paced_end: EndReason | None = None  # an end `streaming_pacing` calls for (worker only)
        self._cancelled = False
        self._pause = PauseGate(request_id, self.touch)  # a detached proxy session (set_paused)
        self._thread = threading.Thread(target=self._run, name=f"session-{request_id[-8:]}", daemon=True)
        self._clock = PlaybackClock(
            chunk_seconds=config.frames_per_chunk / config.fps,
            fps=config.fps,
            lead_chunks=limits.pacing_lead_chunks if source.pacing else None,
            pacer=_playhead_pacer(config, limits, source),
            wake=self._wake,
            touch=self.touch,
            playhead=_playhead_lead(config, limits, source),
        )

    # --- request path -------------------------------------------------------------------
    def start(self) -> None:
        with self._stream_lock:
            self.channel.send(server_messages.video_start(self.request_id, self.config.format, self.config.to_json()))
        self._thread.start()

    def abandon(self) -> None:
        """Free everything of a session whose worker never started (its start failed)."""
        with self._stream_lock:
            self._desk.end()
        self._release()

    @property
    def ended(self) -> bool:
        return self._desk.ended

    def request_stop(self) -> None:
        """End after the chunk in hand (it is finished and sent, docs/protocol.md §2.3)."""
        if self._stop_at is None:
            self._stop_at = time.monotonic()
        self._stop_requested = True
        self._wake.set()

    def touch(self) -> None:
        self.stats.last_progress = time.monotonic()

    def interact(self, request: InteractionRequest, reply: Channel, received: float | None = None) -> None:
        """Admit, ack on the request's own stream, then queue for the next boundary (`EventDesk.admit`);
        an event the active model refuses is acked, then failed on the start stream."""
        refused = self._desk.admit(request, reply, received)
        if refused is not None:
            self._event_failed(refused)

    def fail(self, reason: EndReason, message: str) -> None:
        """End the session from any thread with `reason`'s error, then `session.done`."""
        assert reason.error is not None, reason
        self._finish(reason, message)

    def poll_cancelled(self) -> None:
        """Ask Triton whether the client cancelled the start stream, and wake the worker if
        so. The manager's watch loop calls it for every live session (the one periodic
        poll: see `watchdog.watch`); it never waits for a send in progress."""
        if not self._stream_lock.acquire(blocking=False):
            return  # sending: asked again next round
        try:
            if not self._desk.ended:
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
        except PlayerIdle as exc:  # the engine's own idle end of a paced session
            log.warning("request_id=%s %s", self.request_id, exc)
            self._release()
            self._finish(EndReason.STALL_TIMEOUT, str(exc))
            return
        except Exception as exc:
            log.exception("request_id=%s generation failed", self.request_id)
            self._release()
            self._finish(EndReason.GENERATION_FAILED, f"generation failed: {type(exc).__name__}: {exc}")
            return
        if reason is not None:  # an ending error sends no trailer pair (docs/protocol.md §3.4)
            self._finish(reason, self._end_message, trailer=b"" if reason.error is not None else trailer)

    def _generate(self, started: float) -> EndReason | None:
        """Stream chunks until an end; None when another thread ended the session (`fail`)."""
        cfg = self.config
        while True:
            if self._desk.ended:
                return None
            if self._cancelled:
                return EndReason.CANCELLED
            if self._stop_requested:
                return EndReason.STOPPED
            if self._paced_end is not None:
                return self._paced_end
            remaining = None if cfg.num_frames is None else cfg.num_frames - self.stats.frames_sent
            if remaining is not None and remaining <= 0:
                return EndReason.COMPLETE
            if self._pause.holding:
                started += self._pause.hold(self._wake)  # the session-length clock does not run
                continue  # the checks above again: a stop or the end may have come meanwhile
            if time.monotonic() - started >= self._limits.max_session_seconds:
                return EndReason.LIMIT
            if not self._clock.wait_turn(self.stats.chunks_sent, self.stats.frames_sent):
                continue  # woken by a stop, a cancellation or the end: the checks above say which
            frames_wanted = cfg.frames_per_chunk if remaining is None else min(cfg.frames_per_chunk, remaining)
            if self._wait_player(frames_wanted) is not PlayerWait.GO:
                continue  # woken, or the player idle: the checks above say which
            boundary = time.monotonic()
            item = self._source.next_chunk(frames_wanted)
            if item is None:
                continue  # interrupted: the checks above say why
            if isinstance(item, FailedEvent):
                self._event_failed(item)
                continue
            if self._oversized(item):
                continue  # the checks above end the session
            if not self._send_chunk(item):
                continue  # ended or cancelled meanwhile
            self._clock.chunk_sent(time.monotonic() - boundary)

    def _wait_player(self, frames_wanted: int) -> PlayerWait:
        """vLLM-Omni 0.32's playhead bound (`streaming_pacing`): wait until the next chunk fits
        within the lead over the player's reported position. IDLE (the player made no progress
        for `idle_timeout_s` meanwhile) sets the end's message."""
        pacing = self.config.streaming_pacing
        if pacing is None:
            return PlayerWait.GO
        waited = self._clock.wait_player(frames_wanted / self.config.fps, pacing.idle_timeout_s)
        if waited is PlayerWait.IDLE:
            self._paced_end = EndReason.STALL_TIMEOUT
            self._end_message = (
                f"no session.playback progress for {pacing.idle_timeout_s:g} s while generation waited for "
                "the player (streaming_pacing.idle_timeout_s)"
            )
        return waited

    def _oversized(self, chunk: SourceChunk) -> bool:
        """0.32's `max_output_bytes`: a paced session whose encoded chunk exceeds it ends (the
        chunk is not sent)."""
        pacing = self.config.streaming_pacing
        size = len(chunk.media.payload)
        if pacing is None or size <= pacing.max_output_bytes:
            return False
        self._paced_end = EndReason.GENERATION_FAILED
        self._end_message = (
            f"an encoded chunk of {size} bytes exceeds streaming_pacing.max_output_bytes ({pacing.max_output_bytes})"
        )
        return True

    # --- pause (a detached proxy session: docs/triton-model.md "Pausing a session") ----------
    @property
    def paused(self) -> bool:
        """Paused and within MAX_PAUSE_SECONDS: the stall clock does not run (watchdog.watch)."""
        return self._pause.paused

    def set_paused(self, paused: bool) -> None:
        """Pause at the next chunk boundary (the chunk in hand is finished and sent) or go on.
        A paused session keeps its slot and generates nothing; its stall and session-length
        clocks stand still, for at most MAX_PAUSE_SECONDS, after which it goes on by itself."""
        self._pause.set(paused)

    # --- playhead reports (session.playback: docs/protocol.md §2.6, §7 "Pacing") -------------
    def playback(self, report: PlaybackReport, received: float | None = None) -> ReportClamp | None:
        """A playhead report from the request path: kept for the pacing (clamped, never an
        error); None when this session does not pace to reports."""
        now = time.monotonic() if received is None else received
        clamp = self._clock.report(report.position_seconds, now, self.stats.frames_sent / self.config.fps)
        if self.config.streaming_pacing is not None and isinstance(self._source, PlayerReports):
            self._source.playback(report.position_seconds)  # the engine paces: it clamps the report itself
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
        pacing = self._clock.chunk_generated(media.frames / self.config.fps, len(media.payload))
        if pacing is not None:  # a paced session (vLLM-Omni 0.32's streaming_pacing)
            meta[OUTPUT_CHUNK_INDEX] = plan.generation_chunk_index
            meta[PACING] = pacing
        elif chunk.stream:  # an engine that paces itself: its own figures
            meta.update(chunk.stream)
        if self.config.metrics:  # asked for in-band timing (docs/protocol.md §6, `timing`)
            meta["timing"] = chunk_timing(media.frames, self.config.fps, media.generate_seconds, media.encode_seconds)
        with self._stream_lock:
            if self._desk.ended or self._cancelled:
                return False
            self.channel.send(meta, media.payload)
            self._desk.chunk_sent(plan)
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
            if self._cancelled or not self._desk.failed(failure.event_id):
                return
            self._metrics.count_interaction(failure.code.value)
            log.info("request_id=%s event_id=%s failed: %s", self.request_id, failure.event_id, failure.why)
            self.channel.send(
                server_messages.error(failure.code, failure.why, request_id=self.request_id, event_id=failure.event_id)
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
            if not self._desk.end():
                return
            self._wake.set()
            self._source.interrupt()
            quiet = not reason.sends or self._check_cancelled()
            if quiet and reason.error is None:
                reason = EndReason.CANCELLED  # a cancelled stream ended it; a failure keeps its reason
            # The slot is free before the client hears of the end: a new start right after
            # `session.done` finds room. (The manager never holds its lock into a session's.)
            self._on_end(self, reason)
            if quiet:
                _complete_quietly(self.channel, self.request_id)
            else:
                try:
                    if reason.error is not None:
                        self.channel.send(server_messages.error(reason.error, message, request_id=self.request_id))
                    if trailer:
                        meta = trailer_metadata(self.request_id, self.stats.chunks_sent, len(trailer))
                        self.channel.send(meta, trailer)
                        self.stats.chunks_sent += 1
                    done = self._desk.done(chunks=self.stats.chunks_sent, stopped=reason.stopped)
                    if reason.stopped and self._stop_at is not None:  # vLLM-Omni 0.32's stop_latency_s
                        done["stop_latency_s"] = round(time.monotonic() - self._stop_at, 6)
                    self.channel.send(done, final=True)
                except Exception:  # noqa: BLE001 - the client may be gone; the session ends anyway
                    log.warning("request_id=%s could not send the end of the session", self.request_id)
                    _complete_quietly(self.channel, self.request_id)
        outcome = self._desk.outcome()
        log.info(
            "request_id=%s ended reason=%s chunks=%d frames=%d unapplied=%s unfinished=%s",
            self.request_id,
            reason.label,
            self.stats.chunks_sent,
            self.stats.frames_sent,
            list(outcome.unapplied),
            list(outcome.unfinished),
        )

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
