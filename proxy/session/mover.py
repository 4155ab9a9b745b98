"""One session's moves to another Triton (docs/recordings.md "Moves").

When the session's Triton is lost (its stream broke: the process killed, the connection gone,
the stub crashed) or drained by the operator, the session goes on elsewhere without the client
noticing: the model on an endpoint with room (the same one after a restart included) rebuilds
it at the next chunk the proxy has not received (rtvideo.proxy.placement.move_log), the proxy sends
again the acked events no chunk started, and the new stream is spliced onto the old one
(rtvideo.proxy.placement.splice). The client's WebSocket stays open; no error, no second
`video.start`, no gap or repeat in the indices.

A session moves only while it streams (or is detached), after the model's `video.start` and
before its trailer, at most `MAX_MOVES` times. When it cannot (nothing left to continue) or no
endpoint takes it within the move patience, it ends as it would have without moves:
`backend_unavailable`, then `session.done`. A vLLM-Omni session moves approximately, from the
last frame sent (rtvideo.core.approximation): the last media payload is kept for that, and
decoded when the move is planned (on the event loop: 15-50 ms at the models' sizes, once per
session; docs/benchmarks.md).
"""

from __future__ import annotations

import enum
import json
import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

from rtvideo.core import protocol, server_messages
from rtvideo.core.chunks import MEDIA, TRAILER
from rtvideo.core.errors import ProtocolError
from rtvideo.core.fmp4 import Continuation, ContinuationError, FragmentCursor, split_init
from rtvideo.proxy.observability.metrics import ProxyMetrics
from rtvideo.proxy.phase import Phase, SessionPhase
from rtvideo.proxy.placement.bridge import BackendUnavailable
from rtvideo.proxy.placement.first_frame import NoFrame, image_url, last_frame
from rtvideo.proxy.placement.move_log import MoveLog, Unmovable
from rtvideo.proxy.placement.splice import Coordinates, Splice, SpliceState
from rtvideo.proxy.placement.streams import StreamSource
from rtvideo.proxy.session.ledger import BookView
from rtvideo.proxy.session.upstream import Upstream
from rtvideo.triton.wire import Reply

log = logging.getLogger(__name__)

#: the most moves one session makes (a session that breaks every endpoint it lands on ends)
MAX_MOVES = 8


class MoveReason(enum.Enum):
    LOSS = "loss"  # its stream broke
    DRAIN = "drain"  # the operator drained its endpoint
    TAKEOVER = "takeover"  # another proxy held it: this one goes on with it (rtvideo.proxy.store)


class Mover:
    """Follows one session's stream, and plans its moves (module docstring).

    Fed on the event loop: `opened` with the start, `forwarded` with every request sent, and
    `arrived` with every reply for the client, which it returns in the session's coordinates."""

    def __init__(
        self,
        streams: StreamSource,
        patience: float,
        metrics: ProxyMetrics,
        book: BookView,
        log_bytes: int | None = None,
    ) -> None:
        self._streams = streams
        self._book = book  # the session's admissions: the move log keeps only admitted events
        self._log_bytes = log_bytes  # the most bytes of event payloads the move log keeps (None: no bound)
        self._patience = patience  # how long a move waits for an endpoint (0: moves off)
        self._metrics = metrics
        self._log: MoveLog | None = None
        self._cursor = FragmentCursor()
        self._last_media = b""  # the last media payload sent: an approximate move starts from its last frame
        self._next_transport = 0
        self._next_generation = 0
        self._ended = False  # the trailer or session.done came: nothing is left to move
        self._unreadable: str | None = None  # why the cursor could not follow the stream
        self._splice: Splice | None = None
        self._moving: tuple[MoveReason, float] | None = None  # until the new stream's first chunk
        self.moves = 0

    def opened(self, start: bytes) -> None:
        """The session.start as sent to the model."""
        try:
            self._log = MoveLog(json.loads(start), self._book, self._log_bytes)
        except (ValueError, ProtocolError) as exc:  # a start the model refuses moves nowhere
            log.debug("no move log: %s", exc)

    def forwarded(self, raw: bytes) -> None:
        if self._log is not None:
            self._log.forwarded(raw)

    def report(self, raw: bytes) -> bytes:
        """A playhead report on its way up, in the current stream's media time."""
        return self._splice.report(raw) if self._splice is not None else raw

    def arrived(self, reply: Reply) -> Reply | None:
        """A reply for the client, in the session's coordinates (None: not the client's)."""
        splice = self._splice
        if splice is not None:
            try:
                translated = splice.translate(reply)
            except ContinuationError as exc:
                self._ended = True  # what the client has cannot be continued: no later move either
                raise BackendUnavailable(f"the moved session's stream cannot continue the old one: {exc}") from None
            if translated is None:
                return None
            reply = translated
        message = reply.message
        if message is None:
            return reply
        self._account(message, reply.data, follows=splice is None or not splice.continues)
        return reply

    def restored(self, message: Mapping[str, Any], data: bytes | None) -> None:
        """A message the session's owner was handed by the proxy it is taken over from, with a
        pair's payload when the store still kept it (else the cursor passes it by its size)."""
        if data is None and message.get("type") == protocol.CHUNK_METADATA and message.get("kind") == MEDIA:
            config = (self._log.config if self._log is not None else None) or {}
            fps = int(config.get("fps") or 0)
            try:
                self._cursor.passed(int(message.get("byte_length") or 0), int(message.get("num_frames") or 0), fps)
            except ContinuationError as exc:
                self._unreadable = str(exc)
            data = b""
        self._account(message, data, follows=bool(data))

    def restored_init(self, init: bytes | None) -> None:
        """The stream's init segment, as the store kept it (before `restored` passes payloads)."""
        if init:
            self._cursor.init = init

    def _account(self, message: Mapping[str, Any], data: bytes | None, *, follows: bool) -> None:
        """What the session's coordinates say of a message the client is handed: the log's events,
        the next indices, the cursor (when `follows`: the payload is not followed already)."""
        if self._log is not None:
            self._log.arrived(message)
        kind = message.get("type")
        if kind == protocol.CHUNK_METADATA and isinstance(message.get("transport_chunk_index"), int):
            self._next_transport = message["transport_chunk_index"] + 1
            if message.get("kind") == MEDIA:
                self._next_generation = int(message.get("generation_chunk_index") or 0) + 1
                self._last_media = data or self._last_media
                if follows and data:
                    self._follow(data, int(message.get("num_frames") or 0))
                self._first_chunk()
            elif message.get("kind") == TRAILER:
                self._ended = True
                if follows:
                    self._cursor.other(data or b"")
        elif kind == protocol.DONE:
            self._ended = True

    def _follow(self, payload: bytes, num_frames: int) -> None:
        """The cursor follows a media payload; one it cannot read leaves nothing to continue."""
        if self._unreadable is not None:
            return
        try:
            self._cursor.media(payload, num_frames)
        except ContinuationError as exc:
            self._unreadable = str(exc)
            log.warning("a payload is no fMP4 fragment (%s): this session cannot move", exc)

    def _first_chunk(self) -> None:
        if self._moving is not None:
            reason, since = self._moving
            self._moving = None
            self._metrics.session_moved(reason.value, time.monotonic() - since)

    def move(self, reason: MoveReason, life: SessionPhase, upstream: Upstream) -> bool:
        """Go on with a new stream, placed on an endpoint with room (waiting up to the patience
        for one); False, the reason logged and counted, when the session cannot move. A
        detached session's generator is paused there too."""
        if life.phase not in (Phase.STREAMING, Phase.DETACHED):
            return False  # not started, ending or ended: nothing to move
        unstarted = self._book.outcome(acked_only=True).unapplied
        try:
            start, resend = self._plan(reason, life.request_id, unstarted)
        except Unmovable as exc:
            log.warning("request_id=%s cannot move (%s): %s", life.request_id, reason.value, exc)
            self._metrics.session_moves_failed.labels(reason.value).inc()
            return False
        stream = self._streams.open_stream(patience=self._patience)
        upstream.take_over(stream, self.report)
        stream.send(start, start=True)
        for raw in resend:
            self.drop_answer(upstream.send(raw))
        if life.phase is Phase.DETACHED:
            upstream.pause(True)
        return True

    def _plan(self, reason: MoveReason, request_id: str | None, unstarted: Iterable[str]) -> tuple[bytes, list[bytes]]:
        """The start to send the new model and the interactions to send again; the replies of
        the stream they go on are spliced from now on. Raises `Unmovable`."""
        if not self._patience:
            raise Unmovable("moves are off (move_patience_seconds 0)")
        if self._splice is not None and self._splice.state is SpliceState.REFUSED:
            raise Unmovable(f"the new endpoint's model refused it: {(self._splice.refusal or {}).get('message')}")
        if self._splice is not None and self._splice.state is SpliceState.AWAITING:
            raise Unmovable("no endpoint started it within the move patience")
        if self._log is None or request_id is None:
            raise Unmovable("the session has not started")
        if self._ended:
            raise Unmovable("the stream had ended")
        if self._unreadable is not None:
            raise Unmovable(f"its stream cannot be followed: {self._unreadable}")
        if self.moves >= MAX_MOVES:
            raise Unmovable(f"it moved {MAX_MOVES} times already")
        start = self._log.start_at(self._next_generation, *self._last_frame())
        fps = int((self._log.config or {}).get("fps") or 0)
        try:
            continuation = Continuation(self._cursor, fps) if self._cursor.init else None
        except ContinuationError as exc:
            raise Unmovable(f"its stream cannot be continued: {exc}") from None
        media_seconds = self._cursor.frames / fps if fps else 0.0
        self._splice = Splice(Coordinates(request_id, self._next_transport, media_seconds), continuation)
        self._moving = (reason, time.monotonic())
        self.moves += 1
        resend = self._log.resend(unstarted)
        log.info(
            "request_id=%s moving (%s) at generation chunk %d, transport chunk %d; %d event(s) sent again",
            request_id,
            reason.value,
            self._next_generation,
            self._next_transport,
            len(resend),
        )
        encoded = server_messages.encode(start).encode("utf-8", "surrogatepass")
        return encoded, resend

    def _last_frame(self) -> tuple[str | None, int]:
        """What an approximate move starts from: the last frame sent as a data URL (None before
        the first chunk), and the frames sent. Raises `Unmovable`."""
        assert self._log is not None
        if self._log.exact or not self._last_media:
            return None, self._cursor.frames
        try:
            _, fragment = split_init(self._last_media)
            return image_url(last_frame(self._cursor.init, fragment)), self._cursor.frames
        except (ContinuationError, NoFrame) as exc:
            raise Unmovable(f"its last frame cannot be read: {exc}") from None

    def drop_answer(self, tag: str) -> None:
        """The new model's answer to `tag` (an interaction sent again) is not the client's."""
        assert self._splice is not None
        self._splice.drop_answer(tag)
