"""One session's broadcast: what its owner is handed, written as an HLS playlist and its segments
(docs/protocol.md "Broadcasts").

The writer is a `RecordingSink` (rtvideo.proxy.participants.handouts): it sees every frame handed to
the owner, in order, on the event loop, and only queues work there. Every write runs on the
broadcasts' one writer thread (`Broadcasts`), in the order queued, so the playlist is always
written after the segment it names. The window (`_listed`, `_unlisted`) is the writer thread's
alone; the state (`BroadcastState`) is the loop's alone.

- The first media payload's init segment (`ftyp`+`moov`) becomes `init.mp4`; each media chunk's
  `moof`+`mdat` one segment, `EXTINF` its frames over the start's fps, titled with its transport
  chunk index (a takeover knows from it what was written). The trailer is not a segment.
- The playlist lists the last `window` segments; a segment that leaves the list stays on the
  store for as many more (RFC 8216bis §6.2.2: a client that loaded an older playlist may still
  fetch it), then is removed; the bytes kept stay within `max_bytes` (the list within half).
- `end()` (the owner's `session.broadcast` {"enabled": false}, or the session's end) writes the
  playlist once more with `EXT-X-ENDLIST`; `let_go()` (the session goes on at another replica)
  stops without it, and the next holder goes on (`resume`).
- A chunk is written once, by its transport index: one that a takeover finds both in the
  session store's log and handed out again is not written twice.
- A write that fails, or a queue longer than `MAX_PENDING_SEGMENTS` (a stuck store), ends the
  broadcast here (logged); the session goes on.
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from enum import Enum
from typing import Any

from rtvideo.core import protocol
from rtvideo.core.chunks import MEDIA
from rtvideo.core.fmp4 import init_segment, strip_init
from rtvideo.proxy.broadcasts import playlist
from rtvideo.proxy.broadcasts.playlist import Segment
from rtvideo.proxy.frames import Frame
from rtvideo.proxy.observability.metrics import ProxyMetrics
from rtvideo.proxy.recordings.backing import Backing

log = logging.getLogger(__name__)

#: segments queued for the writer thread before the store is deemed stuck and the broadcast ended
MAX_PENDING_SEGMENTS = 64
#: the fps of a start whose config does not say (the model's default)
DEFAULT_FPS = 16.0
#: how often a live broadcast's marker is written again (the sweep keeps a broadcast so renewed)
RENEW_SECONDS = 10.0


class BroadcastState(Enum):
    LIVE = "live"
    ENDED = "ended"  # EXT-X-ENDLIST written (or being written)
    LET_GO = "let go"  # continued by another replica: no ENDLIST from here
    FAILED = "failed"  # a write failed or the store was stuck; the session goes on


@dataclass(frozen=True)
class Limits:
    window: int  # segments listed
    max_bytes: int  # bytes one broadcast keeps on the store


def marker(bid: str, started_at: float, ended_at: float | None) -> bytes:
    """The broadcast's record on the store: when it began, was last renewed and ended."""
    fields = {"broadcast_id": bid, "started_at": started_at, "renewed_at": time.time(), "ended_at": ended_at}
    return json.dumps(fields).encode("utf-8")


def chunk_index(title: str) -> int | None:
    """The transport chunk index in an `EXTINF` title (`chunk=12`)."""
    name, _, value = title.partition("=")
    return int(value) if name == "chunk" and value.isdigit() else None


class BroadcastWriter:
    """One broadcast's writes (module docstring)."""

    def __init__(
        self,
        bid: str,
        url: str,
        backing: Backing,
        limits: Limits,
        writer: Executor,
        on_over: Callable[[BroadcastWriter], None],
        metrics: ProxyMetrics | None = None,
    ) -> None:
        self.bid = bid
        self.url = url  # broadcast_url (a capability: never logged)
        self._backing = backing
        self._limits = limits
        self._writer = writer
        self._on_over = on_over
        self._metrics = metrics  # counters: safe from the writer thread
        self.state = BroadcastState.LIVE
        self._fps = DEFAULT_FPS
        self._has_init = False
        self._begun = False  # its video.start was handed out (or it went on from another replica)
        self._earlier: list[tuple[int, int, bytes]] = []  # a takeover's chunks not yet written (`resume`)
        self._pending: deque[Future[None]] = deque()
        # the writer thread's alone:
        self._listed: list[Segment] = []
        self._unlisted: deque[Segment] = deque()
        self._indices: dict[int, int] = {}  # segment sequence → transport chunk index
        self._target = 1
        self._started_at = time.time()
        self._renewed = 0.0
        self._broken = False
        self.last_index = -1  # the last transport chunk index written (the writer thread's)

    # --- on the event loop -----------------------------------------------------------------------
    def _begin(self) -> None:
        """The session's video.start is out: the broadcast begins on the store, its marker first
        (the sweep knows it from then on). A start refused before it leaves nothing there."""
        self._begun = True
        self._submit(self._renew, True)

    def resume(self, init: bytes | None, earlier: Iterable[tuple[int, int, bytes]], fps: float | None) -> None:
        """A broadcast another replica began: go on from its playlist as the store has it, with
        the chunks after what it lists (`earlier`: (transport index, frames, payload) the
        session store kept). Those are written before the first chunk handed out here, and
        only those before it: a chunk the move makes again is handed out here, and that copy
        is the one the owner sees (`_catch_up`)."""
        if fps:
            self._fps = fps
        self._has_init = self._begun = True
        self._earlier = sorted(earlier)
        self._submit(self._go_on, init)

    def _catch_up(self, before: int | None) -> None:
        """The session store's chunks of a takeover, those before the index `before` (None: all)."""
        earlier, self._earlier = self._earlier, []
        for index, frames, data in earlier:
            if before is None or index < before:
                self._submit(self._segment, strip_init(data), frames / self._fps, index)

    def handed_out(self, frame: Frame) -> None:
        if self.state is not BroadcastState.LIVE:
            return
        message = frame.message
        kind = message.get("type")
        if kind == protocol.VIDEO_START:
            if not self._begun:
                self._begin()
            config = message.get("config")
            fps = config.get("fps") if isinstance(config, dict) else None
            if isinstance(fps, (int, float)) and fps > 0:
                self._fps = float(fps)
        elif kind == protocol.CHUNK_METADATA and message.get("kind") == MEDIA and frame.data and self._begun:
            index = message.get("transport_chunk_index")
            frames = message.get("num_frames")
            if self._earlier:
                self._catch_up(index if isinstance(index, int) else None)
            self._chunk(frame.data, frames if isinstance(frames, int) else 0, index if isinstance(index, int) else -1)

    def _chunk(self, data: bytes, frames: int, index: int) -> None:
        init = init_segment(data)
        if init is not None and not self._has_init:
            self._has_init = True
            self._submit(self._put, playlist.INIT, init)
        self._submit(self._segment, strip_init(data), frames / self._fps, index)

    def session_ended(self) -> None:
        """The session is over here (RecordingSink): the playlist ends, unless it was let go."""
        self.end()

    def end(self) -> bool:
        """The broadcast ends (EXT-X-ENDLIST); the session may go on. False when it was not live."""
        if self.state is not BroadcastState.LIVE:
            return False
        self.state = BroadcastState.ENDED
        if self._begun:
            self._catch_up(None)
            self._submit(self._close)
        self._on_over(self)
        return True

    def written(self) -> Future[None]:
        """Done once everything queued so far is written (or failed to be)."""
        while self._pending and self._pending[0].done():
            self._pending.popleft()
        if self._pending:
            return self._pending[-1]
        done: Future[None] = Future()
        done.set_result(None)
        return done

    def let_go(self) -> None:
        """The session goes on at another replica: what is queued is written, no ENDLIST."""
        if self.state is BroadcastState.LIVE:
            self._catch_up(None)  # the next holder finds them written
            self.state = BroadcastState.LET_GO
            self._on_over(self)

    def _submit(self, job: Callable[..., None], *args: Any) -> None:
        while self._pending and self._pending[0].done():
            self._pending.popleft()
        if len(self._pending) >= MAX_PENDING_SEGMENTS:
            log.error("broadcast: the store is stuck (%d writes queued); the broadcast ends", len(self._pending))
            self.state = BroadcastState.FAILED
            self._failed()
            self._on_over(self)
            return
        self._pending.append(self._writer.submit(self._guarded, job, *args))

    def _guarded(self, job: Callable[..., None], *args: Any) -> None:
        if self._broken:
            return
        try:
            job(*args)
        except Exception:  # a full disk, an unreachable bucket: the broadcast stops, the session goes on
            log.exception("broadcast: a write failed; the broadcast stops here")
            self._broken = True
            self._failed()

    def _failed(self) -> None:
        if self._metrics is not None:
            self._metrics.broadcast_failures.inc()

    # --- on the writer thread -------------------------------------------------------------------
    def _put(self, name: str, data: bytes) -> None:
        self._backing.write_bytes(self.bid, name, data)

    def _renew(self, force: bool = False, ended_at: float | None = None) -> None:
        now = time.monotonic()
        if force or ended_at is not None or now - self._renewed >= RENEW_SECONDS:
            self._renewed = now
            self._put(playlist.MARKER, marker(self.bid, self._started_at, ended_at))

    def _go_on(self, init: bytes | None) -> None:
        text = self._backing.read_text(self.bid, playlist.PLAYLIST)
        listing = None
        if text is not None:
            try:
                listing = playlist.parse(text)
            except ValueError:
                log.error("broadcast: its playlist could not be read; it starts again at this replica")
        if listing is not None:
            self._listed = list(listing.segments)
            self._target = listing.target
            index: int | None = None
            for line in text.splitlines() if text else ():  # the chunk indices in the titles
                if line.startswith("#EXTINF:"):
                    index = chunk_index(line.partition(",")[2])
                elif line.endswith(".m4s") and index is not None:
                    self._indices[int(line.removesuffix(".m4s"))] = index
                    self.last_index = max(self.last_index, index)
        if listing is not None and listing.ended:
            self._broken = True  # its owner ended it before the takeover: it stays ended (its marker too)
            return
        self._renew(True)
        if init is not None and self._backing.open(self.bid, playlist.INIT) is None:
            self._put(playlist.INIT, init)

    def _segment(self, body: bytes, duration: float, index: int) -> None:
        if 0 <= index <= self.last_index:
            return  # written already: a takeover's chunk both in the session store and handed out again
        sequence = self._listed[-1].sequence + 1 if self._listed else self._next_unlisted()
        self._put(playlist.segment_name(sequence), body)
        if self._metrics is not None:
            self._metrics.broadcast_segments.inc()
        self._listed.append(Segment(sequence, duration, len(body)))
        self.last_index = max(self.last_index, index)
        self._indices[sequence] = index
        half = self._limits.max_bytes // 2
        while len(self._listed) > 1 and (
            len(self._listed) > self._limits.window or sum(s.size for s in self._listed) > half
        ):
            self._unlisted.append(self._listed.pop(0))
        stored = sum(s.size for s in self._listed) + sum(s.size for s in self._unlisted)
        while self._unlisted and (len(self._unlisted) > self._limits.window or stored > self._limits.max_bytes):
            gone = self._unlisted.popleft()
            stored -= gone.size
            self._indices.pop(gone.sequence, None)
            self._backing.remove_file(self.bid, playlist.segment_name(gone.sequence))
        self._target = playlist.target_duration(self._listed, self._target)
        self._write_playlist(ended=False)
        self._renew()

    def _next_unlisted(self) -> int:
        return self._unlisted[-1].sequence + 1 if self._unlisted else 0

    def _write_playlist(self, ended: bool) -> None:
        text = playlist.render(self._listed, ended, self._target)
        lines = text.split("\n")
        for n, line in enumerate(lines):  # each segment's title: its transport chunk index
            if line.startswith("#EXTINF:") and n + 1 < len(lines):
                sequence = int(lines[n + 1].removesuffix(".m4s"))
                if (index := self._indices.get(sequence)) is not None:
                    lines[n] = f"{line}chunk={index}"
        self._put(playlist.PLAYLIST, "\n".join(lines).encode("utf-8"))

    def _close(self) -> None:
        self._write_playlist(ended=True)
        self._renew(ended_at=time.time())
