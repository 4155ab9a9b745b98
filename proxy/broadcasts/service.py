"""The broadcasts of one proxy (`--broadcast-store`): where they are written, how many may be
live, when an ended one is removed (docs/operations.md "Broadcasts behind a CDN").

A broadcast is a folder (or an object prefix) named by its id, 128 random bits as 32 hex digits
(rtvideo.proxy.recordings.ids): the id is the capability, so `broadcast_url` is the only way to
it. The files are written through the recordings' backings (rtvideo.proxy.recordings.backing):
a local folder, served by the proxy too (rtvideo.proxy.broadcasts.http), or any fsspec URL,
which a CDN serves (the proxy serves none of it).

Bounds: at most `max_live` broadcasts live on this proxy at once (a start asking for one more
is `server_busy`), each keeping at most its window and `max_bytes` on the store
(rtvideo.proxy.broadcasts.writer). An ended broadcast is removed `retention` seconds after its
end; one no proxy renewed for `retention` + `ORPHAN_SECONDS` (its proxy was killed and no
replica went on with it) is removed too. The sweep runs on its own thread, every `sweep_every`
seconds, and never touches a broadcast live on this proxy.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO

from rtvideo.proxy.broadcasts import playlist
from rtvideo.proxy.broadcasts.writer import BroadcastWriter, Limits
from rtvideo.proxy.observability.metrics import ProxyMetrics
from rtvideo.proxy.recordings import ids
from rtvideo.proxy.recordings.backing import Backing, LocalBacking, backing_for
from rtvideo.proxy.settings import ProxySettings

log = logging.getLogger(__name__)

#: a broadcast neither ended nor renewed for its retention and this long is an orphan
ORPHAN_SECONDS = 600.0
#: the path under which the proxy serves a folder store's broadcasts
PREFIX = "/v1/broadcasts"


class NoBroadcastRoom(Exception):
    """As many broadcasts as this proxy may hold are live (`server_busy`)."""


class Broadcasts:
    """One proxy's broadcasts (module docstring)."""

    def __init__(
        self,
        backing: Backing,
        limits: Limits,
        *,
        base_url: str | None = None,
        max_live: int = 64,
        retention: float = 600.0,
        metrics: ProxyMetrics | None = None,
    ) -> None:
        self.backing = backing
        self._limits = limits
        self._base_url = base_url.rstrip("/") if base_url else None
        self._max_live = max_live
        self.retention = retention
        self._metrics = metrics
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="broadcasts")
        self._live: dict[str, BroadcastWriter] = {}  # the loop's; the sweep reads `_live_ids`
        self._lock = threading.Lock()
        self._live_ids: frozenset[str] = frozenset()
        self._stop = threading.Event()
        self._sweeper = threading.Thread(target=self._sweep_loop, name="broadcasts-sweep", daemon=True)
        self._sweeper.start()

    @classmethod
    def create(cls, settings: ProxySettings, metrics: ProxyMetrics | None = None) -> Broadcasts | None:
        if not settings.broadcast_store:
            return None
        return cls(
            backing_for(settings.broadcast_store),
            Limits(window=settings.broadcast_window, max_bytes=settings.broadcast_max_bytes),
            base_url=settings.broadcast_base_url,
            max_live=settings.max_broadcasts,
            retention=settings.broadcast_retention_seconds,
            metrics=metrics,
        )

    @property
    def folder(self) -> Path | None:
        """The local folder the proxy serves (None: an fsspec store, which a CDN serves)."""
        return self.backing.root if isinstance(self.backing, LocalBacking) else None

    @property
    def sweep_every(self) -> float:
        return max(0.2, min(self.retention / 4, 30.0))

    def url(self, bid: str) -> str:
        """`broadcast_url`: at the CDN (`--broadcast-base-url`), else a path on the proxy."""
        return f"{self._base_url or PREFIX}/{bid}/{playlist.PLAYLIST}"

    def begin(self) -> BroadcastWriter:
        """A new broadcast (NoBroadcastRoom when this proxy holds its most)."""
        self._check_room()
        return self._writer_for(ids.new_id())  # it begins on the store with the session's video.start

    def resume(
        self, bid: str, init: bytes | None, earlier: Iterable[tuple[int, int, bytes]], fps: float | None
    ) -> BroadcastWriter:
        """A broadcast another replica began goes on here, under its id (MalformedId when the
        stored id is not one). Never refused for room: the session is already under way."""
        writer = self._writer_for(ids.check(bid))
        writer.resume(init, earlier, fps)
        return writer

    def _check_room(self) -> None:
        if len(self._live) >= self._max_live:
            raise NoBroadcastRoom(
                f"broadcast: this server holds as many live broadcasts as it may ({self._max_live}); try again later"
            )

    def _writer_for(self, bid: str) -> BroadcastWriter:
        writer = BroadcastWriter(
            bid, self.url(bid), self.backing, self._limits, self._writer, self._over, self._metrics
        )
        self._live[bid] = writer
        self._publish_live()
        return writer

    def _over(self, writer: BroadcastWriter) -> None:
        if self._live.get(writer.bid) is writer:
            del self._live[writer.bid]
            self._publish_live()

    def _publish_live(self) -> None:
        with self._lock:
            self._live_ids = frozenset(self._live)
        if self._metrics is not None:
            self._metrics.broadcasts_live.set(len(self._live))

    @property
    def live(self) -> int:
        return len(self._live)

    # --- serving a folder store (rtvideo.proxy.broadcasts.http) --------------------------------
    def open(self, bid: str, name: str) -> tuple[IO[bytes], int] | None:
        """A served file of a broadcast (blocking I/O); None when there is none."""
        if not playlist.SERVED.fullmatch(name) or not ids.ID_PATTERN.fullmatch(bid):
            return None
        return self.backing.open(bid, name)

    # --- the sweep -------------------------------------------------------------------------------
    def sweep(self, now: float | None = None) -> int:
        """Ended broadcasts past their retention, and orphans, removed. Returns how many."""
        now = time.time() if now is None else now
        with self._lock:
            live = self._live_ids
        removed = 0
        for bid in self.backing.ids():
            if bid in live:
                continue
            text = self.backing.read_text(bid, playlist.MARKER)
            try:
                found = json.loads(text) if text else {}
                ended, renewed = found.get("ended_at"), float(found.get("renewed_at") or 0.0)
            except (ValueError, TypeError, AttributeError):
                ended, renewed = None, 0.0
            if isinstance(ended, (int, float)):
                due = now - ended >= self.retention
            else:  # not ended: an orphan once no proxy renewed it for long (a live one renews)
                due = now - max(renewed, self.backing.touched(bid)) >= self.retention + ORPHAN_SECONDS
            if due:
                self.backing.remove(bid)
                removed += 1
        return removed

    def _sweep_loop(self) -> None:
        while not self._stop.wait(self.sweep_every):
            try:
                self.sweep()
            except Exception:  # an unreachable store: tried again at the next sweep
                log.exception("broadcasts: the sweep failed")

    def flush(self, timeout: float = 30.0) -> None:
        """Blocks until every write queued so far is done (blocking: off the event loop)."""
        self._writer.submit(lambda: None).result(timeout)  # one writer thread: it runs after them

    def close(self) -> None:
        """What is queued is written; the sweep stops (blocking: called off the event loop)."""
        self._stop.set()
        self._writer.shutdown(wait=True)
        self._sweeper.join(timeout=10)
