"""Routes Triton sequence requests to sessions: admission control, and the watch loop (stalls,
and the one periodic poll of Triton's cancellation)."""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import OrderedDict

from rtvideo.backend.runtime.ports import Channel, Metrics, NullMetrics
from rtvideo.backend.runtime.session import EndReason, Limits, Session, ended_error
from rtvideo.backend.runtime.sources import ChunkSourceFactory
from rtvideo.core import protocol
from rtvideo.core.errors import ErrorCode, ProtocolError
from rtvideo.core.protocol import InteractionRequest, PingRequest, StopRequest
from rtvideo.core.session_config import ModelCapabilities, SessionConfig, resolve_session_config

log = logging.getLogger(__name__)

_ENDED_IDS_KEPT = 1024


def _is_probe(payload: bytes) -> bool:
    """`session.ping` as the only request of a sequence: the health probe (docs/protocol.md §8)."""
    try:
        return isinstance(protocol.parse_message(payload), PingRequest)
    except ProtocolError:
        return False


class SessionManager:
    """One session per correlation id; never more than `max_sessions` at once."""

    def __init__(
        self,
        *,
        sources: ChunkSourceFactory,
        capabilities: ModelCapabilities,
        limits: Limits,
        max_sessions: int,
        metrics: Metrics | None = None,
        watchdog_interval: float = 0.5,
    ) -> None:
        self._sources = sources
        self._caps = capabilities
        self._limits = limits
        self._max_sessions = max_sessions
        self._metrics = metrics or NullMetrics()
        self._sessions: dict[int, Session] = {}
        # request ids of ended sessions whose sequence is still open, so late requests
        # are answered with their request_id; bounded, dropped at sequence end
        self._ended_ids: OrderedDict[int, str] = OrderedDict()
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._broken: str | None = None  # why the backend cannot generate any more (engine died)
        self._watchdog = threading.Thread(
            target=self._watch, args=(watchdog_interval,), name="stall-watchdog", daemon=True
        )
        self._watchdog.start()

    @property
    def active_sessions(self) -> int:
        with self._lock:
            return len(self._sessions)

    def on_request(
        self, corrid: int, payload: bytes, *, start: bool, end: bool, channel: Channel, received: float | None = None
    ) -> None:
        """Handle one request of a sequence; returns quickly (generation runs on the session's thread).
        `received`: when the request arrived (`time.monotonic()`), if it waited in a queue since."""
        try:
            self._dispatch(
                corrid,
                payload,
                start=start,
                end=end,
                channel=channel,
                received=time.monotonic() if received is None else received,
            )
        except Exception as exc:  # noqa: BLE001 - a bug must answer the request, not hang it
            log.exception("corrid=%s request failed", corrid)
            try:
                if start:  # the start stream must still end with session.done
                    self._refuse(channel, ErrorCode.GENERATION_FAILED, f"the session could not start: {exc}")
                else:
                    channel.send(protocol.error(ErrorCode.GENERATION_FAILED, f"internal error: {exc}"), final=True)
            except Exception:  # noqa: BLE001 - the response may already be final
                pass

    def _dispatch(
        self, corrid: int, payload: bytes, *, start: bool, end: bool, channel: Channel, received: float
    ) -> None:
        if start and end and _is_probe(payload):
            self._probe(corrid, channel)
            return
        if start:
            self._start(corrid, payload, channel)
            if end:  # a one-request sequence: start and stop at once
                self._stop(corrid)
            return
        with self._lock:
            session = self._sessions.get(corrid)
            ended_id = self._ended_ids.pop(corrid, None) if end else self._ended_ids.get(corrid)
        if session is None or session.ended:
            if protocol.is_stop(payload):
                channel.send(None, final=True)  # a stop that raced the end completes as always
            else:
                channel.send(ended_error(session.request_id if session else ended_id), final=True)
            return
        try:
            message = protocol.parse_message(payload)
        except ProtocolError as exc:
            channel.send(protocol.error_from(exc, session.request_id), final=True)
            if end:
                session.request_stop()
            return
        if isinstance(message, InteractionRequest):
            session.interact(message, channel, received)
        elif isinstance(message, PingRequest):
            session.touch()
            channel.send(protocol.pong(), final=True)
        elif isinstance(message, StopRequest):
            session.request_stop()
            channel.send(None, final=True)
            return
        if end:
            session.request_stop()

    def _probe(self, corrid: int, channel: Channel) -> None:
        """The health probe: one pong with FINAL at once; no session, no slot, no session-end metric.
        Like any new sequence on a live correlation id, it ends a session still running there.
        A broken backend answers with `backend_unavailable` instead, so the proxy's supervisor
        takes the model for down."""
        self._stop(corrid)
        with self._lock:
            self._ended_ids.pop(corrid, None)
        if self._broken is not None:
            channel.send(protocol.error(ErrorCode.BACKEND_UNAVAILABLE, self._broken), final=True)
            return
        channel.send(protocol.pong(), final=True)

    def backend_failed(self, reason: str) -> None:
        """The generator can no longer work (a failed engine health check): every live session
        ends with `generation_failed`, new starts get `backend_unavailable`, and so does the
        health probe, until the model is loaded again."""
        with self._lock:
            if self._broken is not None:
                return
            self._broken = reason
            sessions = list(self._sessions.values())
        log.error("backend failed: %s; ending %d session(s)", reason, len(sessions))
        for session in sessions:
            session.fail(EndReason.GENERATION_FAILED, f"the video engine failed: {reason}")

    def _start(self, corrid: int, payload: bytes, channel: Channel) -> None:
        try:
            start = protocol.parse_start(payload)
            config = resolve_session_config(start, self._caps)
        except ProtocolError as exc:
            self._refuse(channel, exc.code, exc.message)
            return
        if self._broken is not None:
            self._refuse(channel, ErrorCode.BACKEND_UNAVAILABLE, f"the video engine is not available: {self._broken}")
            return
        with self._lock:
            previous = self._sessions.pop(corrid, None)  # a new START on a live sequence replaces it
            if previous is not None:
                previous.request_stop()
            if len(self._sessions) >= self._max_sessions:
                session = None
            else:
                session = self._sessions[corrid] = self._new_session(corrid, config, channel)
            count = len(self._sessions)
        if session is None:
            self._refuse(
                channel, ErrorCode.SERVER_BUSY, f"all {self._max_sessions} session slots are in use; try again later"
            )
            return
        self._metrics.set_active_sessions(count)
        log.info("request_id=%s corrid=%s started config=%s", session.request_id, corrid, config.to_json())
        try:
            session.start()
        except Exception:
            with self._lock:
                if self._sessions.get(corrid) is session:
                    del self._sessions[corrid]
            session.abandon()
            raise

    def _new_session(self, corrid: int, config: SessionConfig, channel: Channel) -> Session:
        """A session and its chunk source. Runs on the request path under the manager's lock, so
        anything slow (an encoder, a render worker's open) happens later on the session's thread."""
        request_id = protocol.new_request_id()
        return Session(
            request_id=request_id,
            config=config,
            channel=channel,
            source=self._sources.open(config, request_id),
            limits=self._limits,
            metrics=self._metrics,
            on_end=functools.partial(self._ended, corrid),
        )

    def _refuse(self, channel: Channel, code: ErrorCode, message: str) -> None:
        log.info("start refused: %s: %s", code.value, message)
        self._metrics.count_session_end(code.value)
        channel.send(protocol.error(code, message))
        channel.send(
            protocol.done(None, chunks=0, stopped=False, unapplied_event_ids=[], unfinished_event_ids=[]),
            final=True,
        )

    def _stop(self, corrid: int) -> None:
        with self._lock:
            session = self._sessions.get(corrid)
        if session is not None:
            session.request_stop()

    def _ended(self, corrid: int, session: Session, reason: EndReason) -> None:
        with self._lock:
            if self._sessions.get(corrid) is session:
                del self._sessions[corrid]
                self._ended_ids[corrid] = session.request_id
                while len(self._ended_ids) > _ENDED_IDS_KEPT:
                    self._ended_ids.popitem(last=False)
            count = len(self._sessions)
        self._metrics.set_active_sessions(count)
        self._metrics.count_session_end(reason.label)

    def _watch(self, interval: float) -> None:
        """Every `interval`: end stalled sessions, and ask whether each live session's stream was
        cancelled. This is the one periodic poll of the runtime: Triton tells a model about a
        cancelled request only when asked (`is_cancelled()`, an IPC round trip that takes its
        turn with every session's sends), so one thread asks for all sessions at one rate, and
        the session's waits wake on the answer instead of polling themselves."""
        while not self._closing.wait(interval):
            now = time.monotonic()
            with self._lock:
                sessions = list(self._sessions.values())
            for session in sessions:
                if now - session.stats.last_progress > self._limits.stall_timeout_seconds:
                    session.fail(
                        EndReason.STALL_TIMEOUT, f"no generation progress for {self._limits.stall_timeout_seconds:g} s"
                    )
            for session in sessions:
                try:
                    session.poll_cancelled()
                except Exception:  # noqa: BLE001 - the loop must go on for the other sessions
                    log.exception("request_id=%s cancellation poll failed", session.request_id)

    def shutdown(self) -> None:
        """Stop every session (model unload / server exit)."""
        self._closing.set()
        with self._lock:
            sessions = list(self._sessions.values())
        for session in sessions:
            session.fail(EndReason.BACKEND_UNAVAILABLE, "the server is shutting down")
        self._sources.close()
