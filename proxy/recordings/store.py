"""What the proxy's recordings may take, and how they are found, listed, evicted and deleted
(their files: rtvideo.proxy.recordings.backing).

Bounds (`Limits`), counted over everything written (video, event log, manifest, a spool):
- every byte a live recording writes is charged first (`charge`, on the writer thread, before
  the write); a charge that would take the store past `max_bytes` evicts finished recordings,
  oldest first, and when none is left to evict, or the recording is past its own cap
  (`per_recording`), the charge is refused and the recorder closes the recording there
  (`truncated`); so the store stays within `max_bytes`;
- a new recording is admitted only while the live ones leave room for it at its cap
  (`room_for_new`); finished ones past `max_age` go too;
- a live recording is never evicted, here or by another proxy sharing the store: what has no
  manifest on the backing is live somewhere (or left by a killed proxy) and is not removed.
The counts are this process's (an index of the finished recordings, built at start): a store
shared by several proxies is bounded per proxy (docs/recordings.md).

A recording taken over with its session (`reopen`, `resume_live`) is live here from then on:
its manifest leaves the backing until it ends again. A folder without a manifest is closed as
`incomplete` (`close_leftovers`) only once it has been quiet for `LEFTOVER_QUIET_SECONDS`:
before that it may be another replica's live recording.

A manifest holds the SHA-256 of the recording's token (`TOKEN_DIGEST`); `public` leaves it out
of what is served. Every method here does blocking I/O, so the proxy calls them off its event
loop (the recorder's writer thread, or an executor).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import IO, Any

from rtvideo.proxy.recordings import ids
from rtvideo.proxy.recordings.backing import EVENTS, LIVE, MANIFEST, VIDEO, Backing, write_private

log = logging.getLogger(__name__)

#: the files a client may download (the manifest is served as JSON by its own endpoint)
DOWNLOADS = {VIDEO: "video/mp4", EVENTS: "application/x-ndjson"}
#: the manifest field holding the SHA-256 (hex) of the recording's token; never served
TOKEN_DIGEST = "recording_token_sha256"
#: a folder without a manifest written to this recently may be live on another proxy (longer
#: than a session's resume grace at its most, 300 s: a detached session writes nothing)
LEFTOVER_QUIET_SECONDS = 600.0
#: how often a proxy waiting for another to close a recording it takes over looks again
_POLL_SECONDS = 0.05
#: statuses of a recording that ended short: it is not continued by a takeover
_CLOSED_SHORT = ("failed", "truncated")


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def public(manifest: dict[str, Any]) -> dict[str, Any]:
    """A manifest as served: without its token's digest."""
    return {k: v for k, v in manifest.items() if k != TOKEN_DIGEST}


@dataclass(frozen=True)
class Limits:
    max_bytes: int
    max_age: float  # seconds; 0: no age limit
    per_recording: int = 0  # bytes one recording may take; 0: max_bytes


class Charge(Enum):
    """The answer to a live recording asking to write more (`RecordingStore.charge`)."""

    OK = "ok"
    OVER_ITS_CAP = "over its cap"  # the recording alone reached --recording-max-bytes
    STORE_FULL = "store full"  # live recordings fill --recordings-max-bytes, nothing left to evict


@dataclass(frozen=True)
class Reopened:
    """A recording another proxy began, found for a takeover (`RecordingStore.reopen`)."""

    spool: Path  # where it is appended to: its folder, or a spool holding its published files
    known: dict[str, Any]  # what its manifest or marker says (`started_at`, the token digest, ...)


def _fields(text: str | None) -> dict[str, Any]:
    try:
        found = json.loads(text) if text else {}
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


@dataclass
class _Finished:
    started_at: float
    ended_at: float
    size: int  # everything of it on the store, its manifest included


class RecordingStore:
    """The recordings of one proxy: finished ones in the backing, live ones by their spools."""

    def __init__(self, backing: Backing, limits: Limits) -> None:
        self.backing = backing
        self.limits = limits
        self._live: dict[str, Path] = {}  # id → spool, while its session records
        self._live_manifests: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()  # guards the counts below (the writer thread and HTTP executors)
        self._live_bytes: dict[str, int] = {}  # id → bytes a live recording was charged
        self._markers: dict[str, int] = {}  # id → bytes of a live recording's marker (LIVE), counted
        self._finished: dict[str, _Finished] = {}  # the index of finished recordings (`index`)

    @property
    def per_recording(self) -> int:
        return min(self.limits.per_recording or self.limits.max_bytes, self.limits.max_bytes)

    # --- live recordings (the recorder's writer thread) ----------------------------------------
    def room_for_new(self) -> bool:
        """Whether a new recording may begin: the live ones leave room for it at its cap
        (finished ones can be evicted to make it)."""
        with self._lock:
            return sum(self._live_bytes.values()) + self.per_recording <= self.limits.max_bytes

    def begin(self, rid: str, marker: dict[str, Any]) -> Path:
        """A new live recording's spool, holding its `marker` (LIVE: its start, its token digest)."""
        spool = self.backing.spool_for(rid)
        self._live_in(rid, spool, 0, marker)
        return spool

    def reopen(self, rid: str) -> Reopened | str:
        """A recording another proxy began (and closed when it handed its session off, or left
        when it was killed), to go on with here: not live here until `resume_live`. Why not,
        when it cannot be (none such, or it ended short: failed or truncated)."""
        known = _fields(self.backing.read_text(rid, MANIFEST))
        for key, value in _fields(self.backing.read_text(rid, LIVE)).items():
            known[key] = known.get(key) or value  # a leftover's manifest may lack its start
        if known.get("status") in _CLOSED_SHORT:
            return f"it ended {known['status']} ({known.get('reason', 'no reason given')})"
        spool = self.backing.spool_again(rid)
        return "it is not in the store" if spool is None else Reopened(spool, known)

    def closed_by_holder(self, rid: str, timeout: float) -> bool:
        """Whether the recording has a manifest (the proxy that held it closed it), waiting up to
        `timeout` seconds for one."""
        deadline = time.monotonic() + timeout
        while self.backing.read_text(rid, MANIFEST) is None:
            if time.monotonic() >= deadline:
                return False
            time.sleep(_POLL_SECONDS)
        return True

    def let_go(self, found: Reopened) -> None:
        """A recording found by `reopen` that is not gone on with here (it stays as it was)."""
        self.backing.discard_spool(found.spool)

    def resume_live(self, rid: str, spool: Path, size: int, marker: dict[str, Any]) -> None:
        """A reopened recording of `size` bytes is live here: its manifest leaves the backing
        (another proxy takes it for live, and evicts nothing of it) until it ends again."""
        (spool / MANIFEST).unlink(missing_ok=True)
        self._live_in(rid, spool, size, marker)

    def _live_in(self, rid: str, spool: Path, size: int, marker: dict[str, Any]) -> None:
        text = json.dumps(marker, sort_keys=True)
        write_private(spool / LIVE, text)
        with self._lock:
            self._live[rid] = spool
            self._live_bytes[rid] = size + len(text)
            self._markers[rid] = len(text)
            self._finished.pop(rid, None)

    def _unmark(self, rid: str, spool: Path) -> None:
        """The marker goes before a manifest is written: a proxy waiting for the manifest to take
        the recording over writes its own marker after, never to see it removed."""
        (spool / LIVE).unlink(missing_ok=True)
        with self._lock:
            if rid in self._live_bytes:
                self._live_bytes[rid] -= self._markers.pop(rid, 0)

    def charge(self, rid: str, size: int) -> Charge:
        """Room for `size` more bytes of the live recording `rid`, evicting finished recordings
        (oldest first) when the store would go past its bound; the bytes are counted when OK."""
        with self._lock:
            used = self._live_bytes.get(rid, 0)
            if used + size > self.per_recording:
                return Charge.OVER_ITS_CAP
            self._live_bytes[rid] = used + size
            over = self._total() - self.limits.max_bytes
        if over > 0 and self._evict_bytes(over) < over:
            with self._lock:
                self._live_bytes[rid] -= size
            return Charge.STORE_FULL
        return Charge.OK

    def update_live(self, rid: str, manifest: dict[str, Any]) -> None:
        self._live_manifests[rid] = manifest

    def finish(self, rid: str, manifest: dict[str, Any]) -> None:
        spool = self._live[rid]
        self._unmark(rid, spool)
        text = json.dumps(manifest, indent=1, sort_keys=True)
        write_private(spool / MANIFEST, text)
        self.backing.publish(rid, spool)
        with self._lock:
            size = self._live_bytes.get(rid, 0) + len(text)
            self._finished[rid] = _Finished(
                float(manifest.get("started_at") or 0.0), float(manifest.get("ended_at") or 0.0), size
            )
        self._forget(rid)

    def abandon(self, rid: str, manifest: dict[str, Any]) -> None:
        """A recording dropped while live: its files go, a manifest saying why stays (best effort)."""
        spool = self._live.get(rid)
        if spool is not None:
            self._unmark(rid, spool)
        self._forget(rid)
        if spool is not None:
            for name in (VIDEO, EVENTS):
                path = spool / name
                if path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)
            try:
                text = json.dumps(manifest, indent=1, sort_keys=True)
                write_private(spool / MANIFEST, text)
                self.backing.publish(rid, spool)
            except OSError:
                shutil.rmtree(spool, ignore_errors=True)
            else:
                with self._lock:
                    self._finished[rid] = _Finished(float(manifest.get("started_at") or 0.0), 0.0, len(text))

    def _forget(self, rid: str) -> None:
        with self._lock:
            self._live.pop(rid, None)
            self._live_bytes.pop(rid, None)
            self._markers.pop(rid, None)
        self._live_manifests.pop(rid, None)

    def live_bytes(self) -> int:
        with self._lock:
            return sum(self._live_bytes.values())

    def total_bytes(self) -> int:
        """What this store's recordings take, live ones included (as counted)."""
        with self._lock:
            return self._total()

    def _total(self) -> int:
        return sum(self._live_bytes.values()) + sum(f.size for f in self._finished.values())

    # --- finding, reading, deleting --------------------------------------------------------------
    def manifest(self, rid: str) -> dict[str, Any] | None:
        ids.check(rid)
        live = self._live_manifests.get(rid)
        if live is not None:
            return dict(live)
        text = self.backing.read_text(rid, MANIFEST)
        return None if text is None else json.loads(text)

    def authorised(self, rid: str, token: str | None) -> dict[str, Any] | None:
        """The manifest of `rid` when `token` is its recording's token; None otherwise (no such
        recording, no token, another's token, or a recording made before tokens existed)."""
        manifest = self.manifest(rid)
        digest = manifest.get(TOKEN_DIGEST) if manifest is not None else None
        if token is None or not isinstance(digest, str):
            return None
        return manifest if hmac.compare_digest(digest, token_digest(token)) else None

    def manifests(self) -> list[dict[str, Any]]:
        """Every recording's manifest, the newest first."""
        found = [m for rid in self.backing.ids() if rid not in self._live and (m := self.manifest(rid))]
        found += [dict(m) for m in list(self._live_manifests.values())]
        return sorted(found, key=lambda m: m.get("started_at", 0.0), reverse=True)

    def open(self, rid: str, name: str) -> tuple[IO[bytes], int] | None:
        """A file of a recording (a live one's as written so far); None when there is none."""
        ids.check(rid)
        if name not in DOWNLOADS:
            raise ValueError(f"no file {name!r} in a recording")
        spool = self._live.get(rid)
        if spool is not None:
            try:
                f = (spool / name).open("rb")
            except FileNotFoundError:
                return None
            return f, (spool / name).stat().st_size
        if self.backing.read_text(rid, MANIFEST) is None:
            return None
        return self.backing.open(rid, name)

    def delete(self, rid: str) -> bool:
        """False when there is no such finished recording (a live one is not deleted)."""
        ids.check(rid)
        if rid in self._live or self.backing.read_text(rid, MANIFEST) is None:
            return False
        self._remove(rid)
        return True

    def _remove(self, rid: str) -> int | None:
        """A finished recording gone; the bytes it took. None when it is not finished any more (a
        takeover reopened it on another proxy): it leaves the index, and stays."""
        live_elsewhere = self.backing.read_text(rid, MANIFEST) is None
        if not live_elsewhere:
            self.backing.remove(rid)
        with self._lock:
            gone = self._finished.pop(rid, None)
        return None if live_elsewhere else gone.size if gone is not None else 0

    # --- bounds ----------------------------------------------------------------------------------
    def index(self) -> None:
        """Count the finished recordings on the backing (at start: what earlier runs left)."""
        found: dict[str, _Finished] = {}
        for rid in self.backing.ids():
            if rid in self._live:
                continue
            text = self.backing.read_text(rid, MANIFEST)
            if text is None:
                continue
            try:
                m = json.loads(text)
            except ValueError:
                m = {}
            found[rid] = _Finished(
                float(m.get("started_at") or 0.0), float(m.get("ended_at") or 0.0), int(m.get("bytes", 0)) + len(text)
            )
        with self._lock:
            self._finished = found

    def _oldest_first(self) -> list[tuple[str, _Finished]]:
        with self._lock:
            return sorted(self._finished.items(), key=lambda item: item[1].started_at)

    def _evict_bytes(self, need: int) -> int:
        """Finished recordings removed, oldest first, until `need` bytes are freed; the bytes freed."""
        freed = 0
        for rid, _ in self._oldest_first():
            if freed >= need:
                break
            size = self._remove(rid)
            if size is not None:
                freed += size
                log.info("recordings: %s evicted to keep the store within --recordings-max-bytes", rid)
        return freed

    def evict(self, now: float | None = None) -> list[str]:
        """Finished recordings past `max_age`, then the oldest until all (live ones included) fit
        in `max_bytes`; returns the ids removed."""
        now = time.time() if now is None else now
        removed: list[str] = []
        for rid, footprint in self._oldest_first():
            old = self.limits.max_age > 0 and now - (footprint.ended_at or footprint.started_at or now) > (
                self.limits.max_age
            )
            if (old or self.total_bytes() > self.limits.max_bytes) and self._remove(rid) is not None:
                removed.append(rid)
        return removed

    def close_leftovers(self, now: float | None = None) -> list[str]:
        """Folders a killed proxy left without a manifest: closed as `incomplete` (their files
        kept; their marker's start and token digest in the manifest), so nothing is lost and the
        bounds count them. One with a marker written to in the last `LEFTOVER_QUIET_SECONDS` may
        be live on another proxy sharing the store: it is left for a later pass."""
        now = time.time() if now is None else now
        closed = []
        for rid in self.backing.ids():
            if rid in self._live or self.backing.read_text(rid, MANIFEST) is not None:
                continue
            marker = _fields(self.backing.read_text(rid, LIVE))
            if marker and now - self.backing.touched(rid) < LEFTOVER_QUIET_SECONDS:
                continue
            size = 0
            for name in (VIDEO, EVENTS):
                opened = self.backing.open(rid, name)
                if opened is not None:
                    opened[0].close()
                    size += opened[1]
            manifest = {"recording_id": rid, "status": "incomplete", "bytes": size}
            manifest["started_at"] = float(marker.get("started_at") or 0.0)
            if isinstance(marker.get(TOKEN_DIGEST), str):
                manifest[TOKEN_DIGEST] = marker[TOKEN_DIGEST]
            self.backing.remove_file(rid, LIVE)
            self.backing.write_text(rid, MANIFEST, json.dumps(manifest, indent=1, sort_keys=True))
            closed.append(rid)
        return closed


def read_chunks(f: IO[bytes], start: int, length: int, size: int = 256 * 1024) -> Iterator[bytes]:
    """`length` bytes of `f` from `start`, in pieces."""
    f.seek(start)
    left = length
    while left > 0:
        piece = f.read(min(size, left))
        if not piece:
            return
        left -= len(piece)
        yield piece
