"""Routes Triton sequence requests to sessions: admission control, and the watch loop (stalls,
and the one periodic poll of Triton's cancellation)."""

from __future__ import annotations

import functools
import hmac
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from rtvideo.backend.image_reference import MediaPolicy, load_image_reference, resize_image
from rtvideo.backend.runtime.ports import Channel, Metrics, NullMetrics
from rtvideo.backend.runtime.session import EndReason, Limits, Session, ended_error
from rtvideo.backend.runtime.sources import ChunkSourceFactory
from rtvideo.core import protocol, server_messages, start_request
from rtvideo.core.errors import ErrorCode, ProtocolError
from rtvideo.core.protocol import InteractionRequest, PingRequest, PlaybackReport, RevokeSteering, StopRequest
from rtvideo.core.rebuild import Rebuild, check_rebuild, split_start
from rtvideo.core.session_config import ModelCapabilities, SessionConfig, resolve_session_config
from rtvideo.logsetup import prompt_summary
from rtvideo.triton.access import SESSION_SECRET_PARAMETER, short_hash

log = logging.getLogger(__name__)

_ENDED_IDS_KEPT = 1024
#: the shortest session secret a `session.start` may carry (docs/protocol.md §8)
MIN_SECRET_CHARS = 16
#: the answer to a request whose secret is not its session's: nothing of the session in it
NOT_YOURS = "this request does not belong to the session"


def _is_probe(payload: bytes) -> bool:
    """`session.ping` as the only request of a sequence: the health probe (docs/protocol.md §8)."""
    try:
        return isinstance(protocol.parse_message(payload), PingRequest)
    except ProtocolError:
        return False


#: runs a callable on the request thread, after the requests queued before it (`RequestDispatcher.call_soon`)
CallSoon = Callable[[Callable[[], None]], None]


@dataclass
class _PendingStart:
    """A start waiting for its remote `image_reference`: the sequence's later requests wait with it,
    in order, so they meet the session (or its refusal) as if the start had been handled at once."""

    stop_after: bool  # the start was also the sequence's end
    deferred: list[tuple[tuple[Any, ...], dict[str, Any]]] = field(default_factory=list)


def _is_playback(payload: bytes) -> bool:
    """A playhead report (docs/protocol.md §2.6): never answered, not even after the end."""
    try:
        return isinstance(protocol.parse_message(payload), PlaybackReport)
    except ProtocolError:
        return False


def _same_secret(expected: str, given: str | None) -> bool:
    """Whether `given` is the session's secret (constant time: no timing tells how much matched)."""
    if given is None:
        return False
    return hmac.compare_digest(expected.encode("utf-8", "surrogatepass"), given.encode("utf-8", "surrogatepass"))


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
        idle_timeout_seconds: float | None = None,
        media: MediaPolicy | None = None,
    ) -> None:
        """`idle_timeout_seconds`: Triton's `max_sequence_idle_microseconds` for this model (None:
        unknown). Triton drops a sequence that long without a request and tells the model nothing;
        the watch loop then ends its session with `idle_timeout`."""
        self._sources = sources
        self._media = media or MediaPolicy()  # where a start's image_reference may come from
        self._caps = capabilities
        self._limits = limits
        self._max_sessions = max_sessions
        self._metrics = metrics or NullMetrics()
        self._sessions: dict[int, Session] = {}
        self._idle_timeout = idle_timeout_seconds
        # when each live session's sequence last had a request (time.monotonic()): Triton's idle clock
        self._last_request: dict[int, float] = {}
        # each live session's secret (docs/protocol.md §8): only requests that carry it reach it
        self._secrets: dict[int, str] = {}
        # request id and secret of ended sessions whose sequence is still open, so their
        # owner's late requests are answered with their request_id; bounded, dropped at sequence end
        self._ended_ids: OrderedDict[int, tuple[str, str]] = OrderedDict()
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._broken: str | None = None  # why the backend cannot generate any more (engine died)
        # Starts fetching a remote image_reference, by correlation id. Only the request thread
        # reads or writes it (the fetch thread hands its result back through `_call_soon`).
        self._pending_starts: dict[int, _PendingStart] = {}
        self._call_soon: CallSoon | None = None
        self._watchdog = threading.Thread(
            target=self._watch, args=(watchdog_interval,), name="stall-watchdog", daemon=True
        )
        self._watchdog.start()

    def serve_on(self, call_soon: CallSoon) -> None:
        """Run on a request thread with `call_soon` (the model's dispatcher): a remote
        `image_reference` is then fetched on a thread of its own, so other sessions' requests are
        not held for the fetch. Without it (a manager driven directly) the fetch runs inline."""
        self._call_soon = call_soon

    @property
    def active_sessions(self) -> int:
        with self._lock:
            return len(self._sessions)

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
        if (pending := self._pending_starts.get(corrid)) is not None:  # its start is still fetching
            arrived = time.monotonic() if received is None else received
            pending.deferred.append(
                ((corrid, payload), dict(start=start, end=end, channel=channel, received=arrived, secret=secret))
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
                    self._refuse(channel, ErrorCode.GENERATION_FAILED, f"the session could not start: {exc}")
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
        with self._lock:
            session = self._sessions.get(corrid)
            if session is not None:
                self._last_request[corrid] = received  # any request restarts Triton's idle clock
                expected: str | None = self._secrets.get(corrid)
                ended_id = None
            else:
                ended_id, expected = self._ended_ids.get(corrid, (None, None))
            if expected is not None and not _same_secret(expected, secret):
                foreign = True
            else:
                foreign = False
                if end:
                    self._ended_ids.pop(corrid, None)
        if foreign:
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
        if end:
            session.request_stop()

    def _dispatch_start(self, corrid: int, payload: bytes, *, end: bool, channel: Channel, secret: str | None) -> None:
        """A request with `sequence_start`: the health probe, or a session's start. A new start
        on a correlation id whose session still runs replaces it only with that session's secret."""
        with self._lock:
            live = self._sessions.get(corrid)
            expected = self._secrets.get(corrid) if live is not None and not live.ended else None
        if expected is not None and not _same_secret(expected, secret):
            log.info("sequence=%s a start without the running session's secret was refused", short_hash(corrid))
            self._refuse(
                channel,
                ErrorCode.INVALID_START,
                "this sequence_id has a running session that this request does not belong to; use a fresh sequence_id",
            )
            return
        with self._lock:  # Triton begins a new sequence: whatever ended on this id is gone
            self._ended_ids.pop(corrid, None)
        if end and _is_probe(payload):
            self._probe(corrid, channel)
            return
        if secret is None or len(secret) < MIN_SECRET_CHARS:
            self._refuse(
                channel,
                ErrorCode.INVALID_START,
                f"session.start must carry the request parameter {SESSION_SECRET_PARAMETER!r}: "
                f"a secret of at least {MIN_SECRET_CHARS} characters that every later request repeats",
            )
            return
        self._start(corrid, payload, channel, secret, stop_after=end)
        if end and corrid not in self._pending_starts:  # a one-request sequence: start and stop at once
            self._stop(corrid)

    def _probe(self, corrid: int, channel: Channel) -> None:
        """The health probe: one pong with FINAL at once; no session, no slot, no session-end metric.
        Like any new sequence on a live correlation id, it ends a session still running there
        (only with that session's secret: `_dispatch_start`).
        A broken backend answers with `backend_unavailable` instead, so the proxy's supervisor
        takes the model for down."""
        self._stop(corrid)
        if self._broken is not None:
            channel.send(server_messages.error(ErrorCode.BACKEND_UNAVAILABLE, self._broken), final=True)
            return
        channel.send(server_messages.pong(), final=True)

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

    def _start(
        self, corrid: int, payload: bytes, channel: Channel, secret: str, *, stop_after: bool = False, image: Any = None
    ) -> None:
        """`image`: the start's image_reference already fetched (`_fetched`), else None."""
        try:
            # `rebuild` is the model's own (rtvideo/core/rebuild.py): taken off before the start's schema
            fields, rebuild = split_start(start_request.check_first_message(payload))
            start = start_request.validate_start(fields)
            config = resolve_session_config(start, self._caps)
            if rebuild is not None:
                config = self._rebuilt(rebuild, config)
            if start.image_reference is not None:  # invalid_start before video.start (docs/protocol.md §2.1)
                if image is None and self._call_soon is not None and not start.image_reference.startswith("data:"):
                    self._pending_starts[corrid] = _PendingStart(stop_after)
                    threading.Thread(
                        target=self._fetch,
                        args=(corrid, payload, channel, secret, start.image_reference),
                        name="media-fetch",
                        daemon=True,
                    ).start()
                    return
                if image is None:
                    image = load_image_reference(start.image_reference, self._media)
                # at the session's size at once: what crosses to a render worker or an engine stays small
                config = replace(config, reference_image=resize_image(image, config.width, config.height))
        except ProtocolError as exc:
            self._refuse(channel, exc.code, exc.message)
            return
        if self._broken is not None:
            self._refuse(channel, ErrorCode.BACKEND_UNAVAILABLE, f"the video engine is not available: {self._broken}")
            return
        with self._lock:
            previous = self._sessions.pop(corrid, None)  # a new START on a live sequence replaces it
            self._secrets.pop(corrid, None)
            self._last_request.pop(corrid, None)
            if previous is not None:
                previous.request_stop()
            if len(self._sessions) >= self._max_sessions:
                session = None
            else:
                session = self._sessions[corrid] = self._new_session(corrid, config, channel)
                self._last_request[corrid] = time.monotonic()
                self._secrets[corrid] = secret
            count = len(self._sessions)
        if session is None:
            self._refuse(
                channel, ErrorCode.SERVER_BUSY, f"all {self._max_sessions} session slots are in use; try again later"
            )
            return
        self._metrics.set_active_sessions(count)
        # INFO names the sequence by its hash and the prompt by its length and hash; DEBUG has the text
        logged = {**config.to_json(), "prompt": prompt_summary(config.prompt)}
        log.info("request_id=%s sequence=%s started config=%s", session.request_id, short_hash(corrid), logged)
        log.debug("request_id=%s prompt=%r", session.request_id, config.prompt)
        try:
            session.start()
        except Exception:
            with self._lock:
                if self._sessions.get(corrid) is session:
                    del self._sessions[corrid]
                    self._secrets.pop(corrid, None)
                    self._last_request.pop(corrid, None)
            session.abandon()
            raise

    def _rebuilt(self, rebuild: Rebuild, config: SessionConfig) -> SessionConfig:
        """The session of a start's `rebuild`, if this generator can rebuild one exactly (else
        `invalid_start`): its stream carries what is left from chunk N on, so `num_frames` is
        the recorded one less the N chunks before."""
        if not getattr(self._sources, "rebuilds", False):
            raise ProtocolError(
                ErrorCode.INVALID_START, "rebuild is not supported by this generator: its state cannot be rebuilt"
            )
        check_rebuild(rebuild, frames_per_chunk=config.frames_per_chunk, num_frames=config.num_frames)
        skipped = rebuild.generation_chunk_index * config.frames_per_chunk
        left = None if config.num_frames is None else config.num_frames - skipped
        return replace(config, rebuild=rebuild, num_frames=left)

    def _fetch(self, corrid: int, payload: bytes, channel: Channel, secret: str, url: str) -> None:
        """The fetch thread: bounded by the media policy's timeout and size; its outcome goes
        back to the request thread, where the start goes on."""
        outcome: Any
        try:
            outcome = load_image_reference(url, self._media)
        except ProtocolError as exc:
            outcome = exc
        except Exception as exc:  # noqa: BLE001 - whatever broke, the start is answered
            outcome = ProtocolError(
                ErrorCode.INVALID_START, f"image_reference could not be fetched: {type(exc).__name__}"
            )
        call_soon = self._call_soon
        assert call_soon is not None  # set before any fetch thread is started
        call_soon(functools.partial(self._fetched, corrid, payload, channel, secret, outcome))

    def _fetched(self, corrid: int, payload: bytes, channel: Channel, secret: str, outcome: Any) -> None:
        """On the request thread: the start goes on with its image (or is refused), then the
        sequence's requests that arrived meanwhile are handled, in arrival order."""
        pending = self._pending_starts.pop(corrid)
        try:
            if isinstance(outcome, ProtocolError):
                self._refuse(channel, outcome.code, outcome.message)
            else:
                self._start(corrid, payload, channel, secret, image=outcome)
                if pending.stop_after:
                    self._stop(corrid)
        except Exception as exc:
            log.exception("sequence=%s start failed", short_hash(corrid))
            self._refuse(channel, ErrorCode.GENERATION_FAILED, f"the session could not start: {exc}")
        for args, kwargs in pending.deferred:
            self.on_request(*args, **kwargs)

    def _new_session(self, corrid: int, config: SessionConfig, channel: Channel) -> Session:
        """A session and its chunk source. Runs on the request path under the manager's lock, so
        anything slow (an encoder, a render worker's open) happens later on the session's thread."""
        request_id = server_messages.new_request_id()
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
        channel.send(server_messages.error(code, message))
        channel.send(
            server_messages.done(None, chunks=0, stopped=False, unapplied_event_ids=[], unfinished_event_ids=[]),
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
                self._last_request.pop(corrid, None)
                self._ended_ids[corrid] = (session.request_id, self._secrets.pop(corrid, ""))
                while len(self._ended_ids) > _ENDED_IDS_KEPT:
                    self._ended_ids.popitem(last=False)
            count = len(self._sessions)
        self._metrics.set_active_sessions(count)
        self._metrics.count_session_end(reason.label)

    def _watch(self, interval: float) -> None:
        """Every `interval`: end stalled sessions and sessions whose sequence Triton dropped as idle,
        and ask whether each live session's stream was cancelled. This is the one periodic poll of
        the runtime: Triton tells a model about a cancelled request only when asked
        (`is_cancelled()`, an IPC round trip that takes its turn with every session's sends), and
        nothing at all about a sequence it dropped, so one thread asks for all sessions at one
        rate, and the session's waits wake on the answer instead of polling themselves."""
        idle = self._idle_timeout
        while not self._closing.wait(interval):
            now = time.monotonic()
            with self._lock:
                watched = [(s, self._last_request.get(c)) for c, s in self._sessions.items()]
            sessions = [session for session, _ in watched]
            self._metrics.set_paused_sessions(sum(session.paused for session in sessions))
            for session, last_request in watched:
                # a paused session's stall clock stands still (docs/triton-model.md); its idle one runs
                if not session.paused and now - session.stats.last_progress > self._limits.stall_timeout_seconds:
                    session.fail(
                        EndReason.STALL_TIMEOUT, f"no generation progress for {self._limits.stall_timeout_seconds:g} s"
                    )
                elif idle is not None and last_request is not None and now - last_request > idle:
                    session.fail(
                        EndReason.IDLE_TIMEOUT,
                        f"no request on the session's sequence for {idle:g} s: Triton ended the sequence "
                        f"(send a request, e.g. session.ping, at least every {idle / 2:g} s)",
                    )
            for session in sessions:
                try:
                    session.poll_cancelled()
                except Exception:
                    log.exception("request_id=%s cancellation poll failed", session.request_id)

    def shutdown(self) -> None:
        """Stop every session (model unload / server exit)."""
        self._closing.set()
        with self._lock:
            sessions = list(self._sessions.values())
        for session in sessions:
            session.fail(EndReason.BACKEND_UNAVAILABLE, "the server is shutting down")
        self._sources.close()
