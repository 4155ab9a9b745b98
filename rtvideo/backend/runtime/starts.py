"""The start path of the manager: a `session.start` validated, its image fetched, its session placed.

Apart from `manager.py` because a start is the one request with work of its own: its
fields checked and resolved into a session config (a `rebuild` applied), a remote
`image_reference` fetched on a thread of its own while the sequence's later requests wait
in order, and the session made and placed in the table (or the start refused, which still
ends the start stream with `session.done`).
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from rtvideo.backend.media.image_reference import MediaPolicy, load_image_reference, resize_image
from rtvideo.backend.runtime.capacity import RealtimeCapacity
from rtvideo.backend.runtime.endings import EndReason
from rtvideo.backend.runtime.ports import Channel, Metrics
from rtvideo.backend.runtime.registry import SessionTable
from rtvideo.backend.runtime.session import Limits, Session
from rtvideo.backend.runtime.sources import ChunkSourceFactory
from rtvideo.core import server_messages, start_request
from rtvideo.core.errors import ErrorCode, ProtocolError
from rtvideo.core.rebuild import Rebuild, check_rebuild, split_start
from rtvideo.core.session_config import ModelCapabilities, SessionConfig, resolve_session_config
from rtvideo.logsetup import prompt_summary
from rtvideo.triton.access import short_hash

log = logging.getLogger(__name__)

#: runs a callable on the request thread, after the requests queued before it (`RequestDispatcher.call_soon`)
CallSoon = Callable[[Callable[[], None]], None]
#: a deferred request of a sequence: the positional and keyword arguments of `SessionManager.on_request`
Deferred = tuple[tuple[Any, ...], dict[str, Any]]


@dataclass
class _PendingStart:
    """A start waiting for its remote `image_reference`: the sequence's later requests wait with it,
    in order, so they meet the session (or its refusal) as if the start had been handled at once."""

    stop_after: bool  # the start was also the sequence's end
    deferred: list[Deferred] = field(default_factory=list)


class Starts:
    """Starts sessions into a `SessionTable`.

    `stop(corrid)` asks the session on a correlation id to stop; `replay(*args, **kwargs)`
    handles a deferred request again (the manager's `on_request`); `broken()` says why the
    backend cannot generate any more (None while it can).
    """

    def __init__(
        self,
        *,
        table: SessionTable,
        sources: ChunkSourceFactory,
        capabilities: ModelCapabilities,
        limits: Limits,
        metrics: Metrics,
        media: MediaPolicy,
        broken: Callable[[], str | None],
        stop: Callable[[int], None],
        replay: Callable[..., None],
        capacity: RealtimeCapacity | None = None,
    ) -> None:
        self._table = table
        self._sources = sources
        self._caps = capabilities
        self._limits = limits
        self._metrics = metrics
        self._media = media  # where a start's image_reference may come from
        self._broken = broken
        self._stop = stop
        self._replay = replay
        self._capacity = capacity  # the model's real-time capacity (None: no such check)
        # Starts fetching a remote image_reference, by correlation id. Only the request thread
        # reads or writes it (the fetch thread hands its result back through `call_soon`).
        self._pending: dict[int, _PendingStart] = {}
        self.call_soon: CallSoon | None = None

    def fetching(self, corrid: int) -> bool:
        """Whether the start of `corrid` is still fetching its image."""
        return corrid in self._pending

    def defer(self, corrid: int, request: Deferred) -> bool:
        """Keep a request of a sequence whose start is still fetching, to be handled after it;
        False (nothing kept) when no start of `corrid` is fetching."""
        pending = self._pending.get(corrid)
        if pending is None:
            return False
        pending.deferred.append(request)
        return True

    def start(
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
                if image is None and self.call_soon is not None and not start.image_reference.startswith("data:"):
                    self._pending[corrid] = _PendingStart(stop_after)
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
            self.refuse(channel, exc.code, exc.message)
            return
        broken = self._broken()
        if broken is not None:
            self.refuse(channel, ErrorCode.BACKEND_UNAVAILABLE, f"the video engine is not available: {broken}")
            return
        # Starts are handled one at a time on the request thread, so the live sessions cannot
        # grow between this check and the placing (they can only end, which frees capacity).
        too_much = self._capacity.refusal(config, self._others(corrid)) if self._capacity is not None else None
        if too_much is not None:
            self.refuse(channel, ErrorCode.SERVER_BUSY, too_much)
            return
        session, count = self._table.place(
            corrid, secret, functools.partial(self._new_session, corrid, config, channel)
        )
        if session is None:
            self.refuse(
                channel,
                ErrorCode.SERVER_BUSY,
                f"all {self._table.max_sessions} session slots are in use; try again later",
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
            self._table.drop(corrid, session)
            session.abandon()
            raise

    def _others(self, corrid: int) -> list[SessionConfig]:
        """The configs of the live sessions a start on `corrid` would run beside (one on `corrid`
        itself is replaced by it)."""
        return [s.config for s in self._table.live() if s is not self._table.session_for(corrid)]

    def _rebuilt(self, rebuild: Rebuild, config: SessionConfig) -> SessionConfig:
        """The session of a start's `rebuild`, if this generator can rebuild one exactly (else
        `invalid_start`): its stream carries what is left from chunk N on, so `num_frames` is
        the recorded one less the N chunks before. A generator that `approximates` takes it as
        is (rtvideo.core.rebuild)."""
        if not getattr(self._sources, "rebuilds", False):
            if getattr(self._sources, "approximates", False):
                # the start is the approximation already (rtvideo.core.approximation): its frame,
                # its prompt; its length (`num_frames`, or `seconds` at this fps) less the frames
                # shown before; the source numbers chunks from N on
                left = None if config.num_frames is None else max(1, config.num_frames - rebuild.frames_before)
                return replace(config, rebuild=rebuild, num_frames=left)
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
        call_soon = self.call_soon
        assert call_soon is not None  # set before any fetch thread is started
        call_soon(functools.partial(self._fetched, corrid, payload, channel, secret, outcome))

    def _fetched(self, corrid: int, payload: bytes, channel: Channel, secret: str, outcome: Any) -> None:
        """On the request thread: the start goes on with its image (or is refused), then the
        sequence's requests that arrived meanwhile are handled, in arrival order."""
        pending = self._pending.pop(corrid)
        try:
            if isinstance(outcome, ProtocolError):
                self.refuse(channel, outcome.code, outcome.message)
            else:
                self.start(corrid, payload, channel, secret, image=outcome)
                if pending.stop_after:
                    self._stop(corrid)
        except Exception as exc:
            log.exception("sequence=%s start failed", short_hash(corrid))
            self.refuse(channel, ErrorCode.GENERATION_FAILED, f"the session could not start: {exc}")
        for args, kwargs in pending.deferred:
            self._replay(*args, **kwargs)

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

    def _ended(self, corrid: int, session: Session, reason: EndReason) -> None:
        """A session's end (called by the session, holding its stream lock, never the manager's)."""
        count = self._table.ended(corrid, session)
        self._metrics.set_active_sessions(count)
        self._metrics.count_session_end(reason.label)

    def refuse(self, channel: Channel, code: ErrorCode, message: str) -> None:
        """Refuse a start: its error, then `session.done` with nothing in it, which ends the stream."""
        log.info("start refused: %s: %s", code.value, message)
        self._metrics.count_session_end(code.value)
        channel.send(server_messages.error(code, message))
        channel.send(
            server_messages.done(None, chunks=0, stopped=False, unapplied_event_ids=[], unfinished_event_ids=[]),
            final=True,
        )
