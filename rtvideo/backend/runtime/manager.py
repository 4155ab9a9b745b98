"""Routes Triton sequence requests to sessions: who a request belongs to, and what it does there.

The table of live sessions and its lock are `registry.py`; the start path (validation, a
remote image_reference, placing the session) is `starts.py`; the watch loop (stalls, idle
sequences, and the one periodic poll of Triton's cancellation) is `watchdog.py`.
"""

from __future__ import annotations

import functools
import logging
import threading
import time

from rtvideo.backend.media.image_reference import MediaPolicy
from rtvideo.backend.runtime.capacity import RealtimeCapacity
from rtvideo.backend.runtime.endings import ended_error
from rtvideo.backend.runtime.ports import Channel, Metrics, NullMetrics
from rtvideo.backend.runtime.registry import SessionTable, same_secret
from rtvideo.backend.runtime.session import EndReason, Limits, Session
from rtvideo.backend.runtime.sources import ChunkSourceFactory
from rtvideo.backend.runtime.starts import CallSoon, Starts
from rtvideo.backend.runtime.watchdog import watch
from rtvideo.core import protocol, server_messages
from rtvideo.core.errors import ErrorCode, ProtocolError
from rtvideo.core.interaction.types import InteractionRequest
from rtvideo.core.protocol import EndBroadcast, PingRequest, PlaybackReport, RevokeSteering, StopRequest
from rtvideo.core.session_config import ModelCapabilities
from rtvideo.triton.access import SESSION_SECRET_PARAMETER, short_hash

log = logging.getLogger(__name__)

#: the shortest session secret a `session.start` may carry (docs/protocol.md §8)
MIN_SECRET_CHARS = 16
#: the answer to a request whose secret is not its session's: nothing of the session in it
NOT_YOURS = "this request does not belong to the session"


def _probe_of(payload: bytes) -> PingRequest | None:
    """`session.ping` as the only request of a sequence: the health probe (docs/protocol.md §8)."""
    try:
        message = protocol.parse_message(payload)
    except ProtocolError:
        return None
    return message if isinstance(message, PingRequest) else None


def _is_playback(payload: bytes) -> bool:
    """A playhead report (docs/protocol.md §2.6): never answered, not even after the end."""
    try:
        return isinstance(protocol.parse_message(payload), PlaybackReport)
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
        max_sessions_reason: str = "",
        metrics: Metrics | None = None,
        watchdog_interval: float = 0.5,
        idle_timeout_seconds: float | None = None,
        media: MediaPolicy | None = None,
        capacity: RealtimeCapacity | None = None,
    ) -> None:
        """`capacity`: the model's real-time capacity (None: starts are limited by `max_sessions`
        alone). `idle_timeout_seconds`: Triton's `max_sequence_idle_microseconds` for this model (None:
        unknown). Triton drops a sequence that long without a request and tells the model nothing;
        the watch loop then ends its session with `idle_timeout`."""
        self._sources = sources
        self._metrics = metrics or NullMetrics()
        self._table = SessionTable(max_sessions)  # the sessions, and the manager's lock
        self._capacity = capacity
        self._max_sessions_reason = max_sessions_reason  # why that limit (`BackendSettings.session_rule`)
        self._closing = threading.Event()
        # why the backend cannot generate any more (engine died); set once, under its lock
        self._broken: str | None = None
        self._broken_lock = threading.Lock()
        self._starts = Starts(
            table=self._table,
            sources=sources,
            capabilities=capabilities,
            limits=limits,
            metrics=self._metrics,
            media=media or MediaPolicy(),
            broken=lambda: self._broken,
            capacity=capacity,
            stop=self._stop,
            replay=self.on_request,
        )
        self._watchdog = threading.Thread(
            target=functools.partial(
                watch,
                self._table,
                interval=watchdog_interval,
                closing=self._closing,
                limits=limits,
                metrics=self._metrics,
                idle_timeout=idle_timeout_seconds,
            ),
            name="stall-watchdog",
            daemon=True,
        )
        self._watchdog.start()

    def serve_on(self, call_soon: CallSoon) -> None:
        """Run on a request thread with `call_soon` (the model's dispatcher): a remote
        `image_reference` is then fetched on a thread of its own, so other sessions' requests are
        not held for the fetch. Without it (a manager driven directly) the fetch runs inline."""
        self._starts.call_soon = call_soon

    @property
    def active_sessions(self) -> int:
        return len(self._table)

    def session_for(self, corrid: int) -> Session | None:
        """The live session of a correlation id, if any."""
        return self._table.session_for(corrid)

    def live_sessions(self) -> list[Session]:
        return self._table.live()

    def on_request(
        self,
        corrid: int,
        payload: bytes,
        *,
        start: bool,
        end: bool,
        channel: Channel,
        received: float | None = None,
        secret: str | None = None,
    ) -> None:
        """Handle one request of a sequence; returns quickly (generation runs on the session's thread).
        `received`: when the request arrived (`time.monotonic()`), if it waited in a queue since.
        `secret`: the request's `rtvideo_session_secret` parameter (None when absent): a start
        sets its session's, every later request must repeat it (docs/protocol.md §8)."""
        if self._starts.fetching(corrid):  # its start is still fetching: handled after it, in order
            arrived = time.monotonic() if received is None else received
            self._starts.defer(
                corrid,
                ((corrid, payload), dict(start=start, end=end, channel=channel, received=arrived, secret=secret)),
            )
            return
        try:
            self._dispatch(
                corrid,
                payload,
                start=start,
                end=end,
                channel=channel,
                received=time.monotonic() if received is None else received,
                secret=secret,
            )
        except Exception as exc:
            log.exception("sequence=%s request failed", short_hash(corrid))
            try:
                if start:  # the start stream must still end with session.done
                    self._starts.refuse(channel, ErrorCode.GENERATION_FAILED, f"the session could not start: {exc}")
                else:
                    channel.send(
                        server_messages.error(ErrorCode.GENERATION_FAILED, f"internal error: {exc}"), final=True
                    )
            except Exception:  # noqa: BLE001 - the response may already be final
                pass

    def _dispatch(
        self,
        corrid: int,
        payload: bytes,
        *,
        start: bool,
        end: bool,
        channel: Channel,
        received: float,
        secret: str | None,
    ) -> None:
        if start:
            self._dispatch_start(corrid, payload, end=end, channel=channel, secret=secret)
            return
        # A request is the session's only when it carries the session's secret; any other is
        # answered and changes nothing of the session: no interaction, no stop, no stall clock
        # refreshed (only the mirror of Triton's idle clock, which any request restarts).
        found = self._table.lookup(corrid, secret, received=received, end=end)
        session, ended_id = found.session, found.ended_id
        if found.foreign:
            log.info("sequence=%s a request without its session's secret was refused", short_hash(corrid))
            channel.send(server_messages.error(ErrorCode.INVALID_MESSAGE, NOT_YOURS), final=True)
            return
        if session is None or session.ended:
            if protocol.is_stop(payload) or _is_playback(payload):
                channel.send(None, final=True)  # a stop or a playhead report that raced the end completes as always
            else:
                channel.send(ended_error(session.request_id if session else ended_id), final=True)
            return
        try:
            message = protocol.parse_message(payload)
        except ProtocolError as exc:
            channel.send(server_messages.error_from(exc, session.request_id), final=True)
            if end:
                session.request_stop()
            return
        if isinstance(message, InteractionRequest):
            session.interact(message, channel, received)
        elif isinstance(message, PingRequest):
            if not message.keepalive:  # a keep-alive only keeps the sequence (§8); it is no progress
                session.touch()
            if message.pause is not None:  # the proxy's pause of a detached session (docs/triton-model.md)
                session.set_paused(message.pause)
            channel.send(server_messages.pong(), final=True)
        elif isinstance(message, StopRequest):
            session.request_stop()
            channel.send(None, final=True)
            return
        elif isinstance(message, PlaybackReport):  # a playhead report: kept for the pacing, never answered
            session.playback(message, received)
            channel.send(None, final=True)
        elif isinstance(message, RevokeSteering):  # steer links are the proxy's: over Triton there are none
            channel.send(server_messages.steering_revoked(session.request_id, 0), final=True)
        elif isinstance(message, EndBroadcast):  # broadcasts are the proxy's: over Triton there are none
            refused = ProtocolError(ErrorCode.INVALID_MESSAGE, "the session has no broadcast (the proxy's feature)")
            channel.send(server_messages.error_from(refused, session.request_id), final=True)
        if end:
            session.request_stop()

    def _dispatch_start(self, corrid: int, payload: bytes, *, end: bool, channel: Channel, secret: str | None) -> None:
        """A request with `sequence_start`: the health probe, or a session's start. A new start
        on a correlation id whose session still runs replaces it only with that session's secret."""
        expected = self._table.live_secret(corrid)
        if expected is not None and not same_secret(expected, secret):
            log.info("sequence=%s a start without the running session's secret was refused", short_hash(corrid))
            self._starts.refuse(
                channel,
                ErrorCode.INVALID_START,
                "this sequence_id has a running session that this request does not belong to; use a fresh sequence_id",
            )
            return
        self._table.forget_ended(corrid)  # Triton begins a new sequence: whatever ended on this id is gone
        if end and (probe := _probe_of(payload)) is not None:
            self._probe(corrid, channel, with_status=probe.status)
            return
        if secret is None or len(secret) < MIN_SECRET_CHARS:
            self._starts.refuse(
                channel,
                ErrorCode.INVALID_START,
                f"session.start must carry the request parameter {SESSION_SECRET_PARAMETER!r}: "
                f"a secret of at least {MIN_SECRET_CHARS} characters that every later request repeats",
            )
            return
        self._starts.start(corrid, payload, channel, secret, stop_after=end)
        if end and not self._starts.fetching(corrid):  # a one-request sequence: start and stop at once
            self._stop(corrid)

    def _probe(self, corrid: int, channel: Channel, *, with_status: bool) -> None:
        """The health probe: one pong with FINAL at once; no session, no slot, no session-end metric.
        Like any new sequence on a live correlation id, it ends a session still running there
        (only with that session's secret: `_dispatch_start`).
        A broken backend answers with `backend_unavailable` instead, so the proxy's supervisor
        takes the model for down."""
        self._stop(corrid)
        if self._broken is not None:
            channel.send(server_messages.error(ErrorCode.BACKEND_UNAVAILABLE, self._broken), final=True)
            return
        pong = server_messages.pong()
        channel.send({**pong, "model": self.status()} if with_status else pong, final=True)

    def status(self) -> dict[str, object]:
        """What the health probe's pong says of the model (docs/protocol.md §8): its session
        limit and why, its live sessions, and its real-time capacity (`RealtimeCapacity.describe`)."""
        live = [s.config for s in self._table.live()]
        status: dict[str, object] = {"max_sessions": self._table.max_sessions, "sessions": len(live)}
        if self._max_sessions_reason:
            status["max_sessions_reason"] = self._max_sessions_reason
        if self._capacity is not None:
            status.update(self._capacity.describe(live))
        return status

    def backend_failed(self, reason: str) -> None:
        """The generator can no longer work (a failed engine health check): every live session
        ends with `generation_failed`, new starts get `backend_unavailable`, and so does the
        health probe, until the model is loaded again."""
        with self._broken_lock:
            if self._broken is not None:
                return
            self._broken = reason
        sessions = self._table.live()
        log.error("backend failed: %s; ending %d session(s)", reason, len(sessions))
        for session in sessions:
            session.fail(EndReason.GENERATION_FAILED, f"the video engine failed: {reason}")

    def _stop(self, corrid: int) -> None:
        session = self._table.session_for(corrid)
        if session is not None:
            session.request_stop()

    def shutdown(self) -> None:
        """Stop every session (model unload / server exit)."""
        self._closing.set()
        sessions = self._table.live()
        for session in sessions:
            session.fail(EndReason.BACKEND_UNAVAILABLE, "the server is shutting down")
        self._sources.close()
