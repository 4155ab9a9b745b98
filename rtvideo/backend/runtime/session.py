"""One live session: a worker thread that takes chunks from its source, encodes and streams them.

Where chunks and their events come from is the session's `ChunkSource`
(`rtvideo/backend/runtime/sources.py`): our tracker plus the built-in generator, or an engine
that resolves boundaries itself. The request path (interactions, pings, stop) admits
events under one lock; the ack is sent while that lock is held and before the source
sees the event, so no chunk metadata can name an event ahead of its ack.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rtvideo.backend.runtime.ports import Channel, ChunkEncoder, Metrics
from rtvideo.core import protocol
from rtvideo.core.chunks import media_metadata, trailer_metadata
from rtvideo.core.errors import ErrorCode, ProtocolError
from rtvideo.core.event_types import SUPPORTED_EVENT_FIELDS
from rtvideo.core.idempotency import IdempotencyRegistry
from rtvideo.core.protocol import InteractionRequest
from rtvideo.core.session_config import SessionConfig

if TYPE_CHECKING:
    from rtvideo.backend.runtime.sources import ChunkSource, SourceChunk

log = logging.getLogger(__name__)

# How often a pacing wait looks for cancellation. Each look is an IPC round trip to
# tritonserver that takes its turn with every session's sends (model.py `_IPC`).
_POLL_SECONDS = 0.5


def ended_error(request_id: str | None) -> dict[str, Any]:
    """The answer to a request that arrives after the session ended (or never started)."""
    if request_id is None:
        return protocol.error(ErrorCode.INVALID_MESSAGE, "this sequence has no running session")
    return protocol.error(ErrorCode.INVALID_MESSAGE, "the session has ended", request_id=request_id)


@dataclass(frozen=True)
class Limits:
    pacing_lead_chunks: float | None
    max_session_seconds: float
    stall_timeout_seconds: float


@dataclass
class SessionStats:
    chunks_sent: int = 0
    frames_sent: int = 0
    last_progress: float = field(default_factory=time.monotonic)


class Session:
    """Owns a chunk source and an encoder; ends exactly once with `session.done`."""

    def __init__(
        self,
        *,
        request_id: str,
        config: SessionConfig,
        channel: Channel,
        source: ChunkSource,
        open_encoder: Callable[[], ChunkEncoder] | None,
        limits: Limits,
        metrics: Metrics,
        on_end: Callable[[Session, str], None],
    ) -> None:
        self.request_id = request_id
        self.config = config
        self.channel = channel
        self._source = source
        self._open_source: ChunkSource | None = source  # until closed (once)
        # Opened on the session's thread: opening a codec takes milliseconds that the request
        # path (every session's acks) must not wait for. None: the source encodes.
        self._open_encoder = open_encoder
        self._encoder: ChunkEncoder | None = None
        self._limits = limits
        self._metrics = metrics
        self._on_end = on_end
        self.registry = IdempotencyRegistry()
        self.stats = SessionStats()
        self._lock = threading.Lock()  # registry + admission to the source + "ack before mention"
        self._send_lock = threading.Lock()  # start-stream sends + the ended flag
        self._wake = threading.Event()
        self._stop_requested = False
        self._ended = False
        self._thread = threading.Thread(target=self._run, name=f"session-{request_id[-8:]}", daemon=True)

    # --- request path -------------------------------------------------------------------
    def start(self) -> None:
        self._send({**protocol.video_start(self.request_id, self.config.format, self.config.to_json())})
        self._thread.start()

    def abandon(self) -> None:
        """Free everything of a session whose worker never started (its start failed)."""
        self._ended = True
        self._release()

    @property
    def ended(self) -> bool:
        return self._ended

    def request_stop(self) -> None:
        self._stop_requested = True
        self._wake.set()

    def touch(self) -> None:
        self.stats.last_progress = time.monotonic()

    def interact(self, request: InteractionRequest, reply: Channel, received: float | None = None) -> None:
        """Validate idempotency, ack on the request's own stream, then queue for the next boundary.

        Holds the send lock too (in `_finish`'s order), so an event is either admitted
        before the session's end is computed, and so reaches an end in `session.done`,
        or refused because the session has ended.
        """
        received = time.monotonic() if received is None else received
        request = request.with_event_id()
        event_id = request.event_id
        assert event_id is not None
        unsupported = sorted(set(request.event) - SUPPORTED_EVENT_FIELDS)
        with self._send_lock, self._lock:
            if self._ended:
                reply.send(ended_error(self.request_id), final=True)
                return
            try:
                new = self.registry.admit(event_id, request.fingerprint)
            except ProtocolError as exc:
                self._metrics.count_interaction(exc.code.value)
                reply.send(protocol.error_from(exc, self.request_id), final=True)
                log.info("request_id=%s event_id=%s rejected: %s", self.request_id, event_id, exc)
                return
            try:
                reply.send(protocol.queued(self.request_id, event_id), final=True)
            except Exception:  # noqa: BLE001 - recorded ids must be applied, or a retry would skip them
                log.warning("request_id=%s event_id=%s ack not delivered", self.request_id, event_id)
            ack_seconds = time.monotonic() - received
            self._metrics.observe_ack(ack_seconds)
            if not new:
                self._metrics.count_interaction("retry")
                log.info("request_id=%s event_id=%s retry acked again", self.request_id, event_id)
            elif unsupported:
                self._metrics.count_interaction("interaction_failed")
                log.info("request_id=%s event_id=%s unsupported fields %s", self.request_id, event_id, unsupported)
                self.channel.send(
                    protocol.error(
                        ErrorCode.INTERACTION_FAILED,
                        f"event field(s) {', '.join(unsupported)} not supported by the active model; "
                        "nothing of this event was applied",
                        request_id=self.request_id,
                        event_id=event_id,
                    )
                )
            else:
                self._source.admit(event_id, request.event["prompt"], request.transition_chunks)
                self._metrics.count_interaction("queued")
                log.info(
                    "request_id=%s event_id=%s queued transition_chunks=%s ack_ms=%.2f",
                    self.request_id,
                    event_id,
                    request.transition_chunks,
                    ack_seconds * 1e3,
                )

    def event_failed(self, event_id: str, why: str, forget: Callable[[], None]) -> None:
        """The source could not apply an acked event: `interaction_failed`; the session goes on.

        `forget` drops the event from the source's open events; it runs under the send lock,
        like `_finish`, so the event gets exactly one end: this error, or (when the session
        ended first) a place in `session.done`."""
        with self._send_lock:
            if self._ended:
                return
            forget()
            self._metrics.count_interaction("interaction_failed")
            log.info("request_id=%s event_id=%s failed: %s", self.request_id, event_id, why)
            self.channel.send(
                protocol.error(ErrorCode.INTERACTION_FAILED, why, request_id=self.request_id, event_id=event_id)
            )

    def fail(self, code: ErrorCode, message: str) -> None:
        """End the session from any thread with an error, then `session.done`."""
        self._finish(stopped=False, reason=code.value, error=(code, message))

    # --- worker -------------------------------------------------------------------------
    def _run(self) -> None:
        """Generate until an end, free everything, then report the end: a client that has
        `session.done` may count on the session's resources being free."""
        try:
            if self._open_encoder is not None:
                self._encoder = self._open_encoder()
            reason = self._generate(time.monotonic())
            trailer = self._close_encoder() + self._close_source()  # the source's, when it encodes
        except Exception as exc:  # noqa: BLE001 - any generator/encoder crash ends the session
            log.exception("request_id=%s generation failed", self.request_id)
            self._release()
            self.fail(ErrorCode.GENERATION_FAILED, f"generation failed: {type(exc).__name__}: {exc}")
            return
        self._release()
        self._finish(stopped=reason == "stopped", reason=reason, trailer=trailer, send=reason != "cancelled")

    def _generate(self, started: float) -> str:
        cfg = self.config
        chunk_seconds = cfg.frames_per_chunk / cfg.fps
        playback_zero: float | None = None
        while True:
            if self.channel.is_cancelled():
                return "cancelled"
            if self._ended:
                return "ended"
            if self._stop_requested:
                return "stopped"
            remaining = None if cfg.num_frames is None else cfg.num_frames - self.stats.frames_sent
            if remaining is not None and remaining <= 0:
                return "complete"
            if time.monotonic() - started >= self._limits.max_session_seconds:
                return "limit"
            lead = self._limits.pacing_lead_chunks if self._source.pacing else None
            if playback_zero is not None and lead is not None:
                due = playback_zero + (self.stats.chunks_sent - lead) * chunk_seconds
                behind = time.monotonic() - due
                if behind > chunk_seconds:
                    # A pause (a starved CPU, a stopped process) also stalled the client's playback:
                    # re-base the clock instead of bursting the missed chunks out at once.
                    playback_zero += behind
                    due += behind
                if not self._wait_until(due):
                    continue  # woken early: re-check stop/cancel before generating
            frames_wanted = cfg.frames_per_chunk if remaining is None else min(cfg.frames_per_chunk, remaining)
            chunk = self._source.next_chunk(frames_wanted, self._interrupted)
            if chunk is None:
                continue  # interrupted while waiting: the checks above say why
            plan = chunk.plan
            payload, frame_count, encode_seconds = self._encode(chunk, remaining)
            meta = media_metadata(self.request_id, self.stats.chunks_sent, plan, frame_count, len(payload))
            if not self._send(meta, payload):
                return "ended"
            if playback_zero is None:
                playback_zero = time.monotonic()
            self.stats.chunks_sent += 1
            self.stats.frames_sent += frame_count
            self.touch()
            self._metrics.observe_chunk(chunk.generate_seconds, encode_seconds, frame_count, len(payload))
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

    def _encode(self, chunk: SourceChunk, remaining: int | None) -> tuple[bytes, int, float]:
        """The chunk's payload, its frame count and the encoding time: encoded here, or already
        by a source that encodes where it renders (a render worker)."""
        if chunk.payload is not None:
            return chunk.payload, chunk.num_frames, chunk.encode_seconds
        assert chunk.frames is not None and self._encoder is not None
        frames = chunk.frames if remaining is None else chunk.frames[:remaining]  # exactly num_frames
        t0 = time.perf_counter()
        payload = self._encoder.encode_chunk(frames)
        return payload, len(frames), time.perf_counter() - t0

    def _interrupted(self) -> bool:
        """Whether a wait for the source must end early: the client left or the session ended.
        A stop does not interrupt it: the chunk being generated is finished and sent (§2.3)."""
        return self._ended or self.channel.is_cancelled()

    def _wait_until(self, due: float) -> bool:
        """Sleep until `due`; False if woken by stop, cancel or end (the caller re-checks)."""
        while True:
            left = due - time.monotonic()
            if left <= 0:
                return True
            if self._wake.wait(min(left, _POLL_SECONDS)):
                self._wake.clear()
                return False
            if self.channel.is_cancelled() or self._ended:
                return False
            self.touch()  # pacing is deliberate waiting, not a stall

    # --- ending -------------------------------------------------------------------------
    def _send(self, message: Mapping[str, Any], data: bytes = b"", *, final: bool = False) -> bool:
        with self._send_lock:
            if self._ended:
                return False
            self.channel.send(message, data, final=final)
            return True

    def _finish(
        self,
        *,
        stopped: bool,
        reason: str,
        error: tuple[ErrorCode, str] | None = None,
        trailer: bytes = b"",
        send: bool = True,
    ) -> None:
        with self._send_lock:
            if self._ended:
                return
            self._ended = True
            self._wake.set()
            with self._lock:
                outcome = self._source.finish()
            # The slot is free before the client hears of the end: a new start right after
            # `session.done` finds room. (The manager never holds its lock into the send lock.)
            self._on_end(self, reason)
            if not send or self.channel.is_cancelled():
                self._complete_quietly()
            else:
                try:
                    if error is not None:
                        self.channel.send(protocol.error(error[0], error[1], request_id=self.request_id))
                    if trailer:
                        meta = trailer_metadata(self.request_id, self.stats.chunks_sent, len(trailer))
                        self.channel.send(meta, trailer)
                        self.stats.chunks_sent += 1
                    self.channel.send(
                        protocol.done(
                            self.request_id,
                            chunks=self.stats.chunks_sent,
                            stopped=stopped,
                            unapplied_event_ids=list(outcome.unapplied),
                            unfinished_event_ids=list(outcome.unfinished),
                        ),
                        final=True,
                    )
                except Exception:  # noqa: BLE001 - the client may be gone; the session ends anyway
                    log.warning("request_id=%s could not send the end of the session", self.request_id)
                    self._complete_quietly()
        log.info(
            "request_id=%s ended reason=%s chunks=%d frames=%d unapplied=%s unfinished=%s",
            self.request_id,
            reason,
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

    def _close_encoder(self) -> bytes:
        encoder, self._encoder = self._encoder, None
        return encoder.close() if encoder is not None else b""

    def _close_source(self) -> bytes:
        source, self._open_source = self._open_source, None
        return source.close() if source is not None else b""

    def _release(self) -> None:
        """Free the source (generator state, or the engine request) and the encoder, however the worker ended."""
        for close in (self._close_source, self._close_encoder):
            try:
                close()
            except Exception:  # noqa: BLE001 - releasing must go on
                log.exception("request_id=%s release failed", self.request_id)
