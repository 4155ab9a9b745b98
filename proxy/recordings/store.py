"""What the proxy's recordings may take, and how they are found, listed, evicted and deleted
(their files: rtvideo.proxy.recordings.backing).

Bounds (`Limits`), counted over everything written (video, event log, manifest, a spool) as it
takes the store's disk: allocated blocks, at least one block a file (`backing.allocated`), and
a folder's block; and over the number of recordings (live and finished):
- every byte a live recording writes is charged first (`charge`, on the writer thread, before
  the write), as the blocks it adds; a charge that would take the store past `max_bytes` evicts
  finished recordings, oldest first, and when none is left to evict, or the recording is past
  its own cap (`per_recording`), the charge is refused and the recorder closes the recording
  there (`truncated`); so the store stays within `max_bytes`;
- a new recording is admitted only while the live ones (and those admitted, not yet begun:
  `reserve`) leave room for it at its cap and in `max_count`; it evicts the oldest finished
  recording when the count needs it; finished ones past `max_age` go too;
- a live recording is never evicted, here or by another proxy sharing the store: what has no
  manifest on the backing is live somewhere (or left by a killed proxy) and is not removed.

The counts are this process's: an index of the finished recordings (their bytes on the store,
their age, their token's digest), built once at start (`index`) and kept as recordings finish,
are deleted and are evicted; so an eviction costs what it removes, never a pass over every
recording (its order by age is a heap). A store shared by several proxies is bounded per proxy
(docs/recordings.md).

A recording taken over with its session (`reopen`, `resume_live`) is live here from then on:
its manifest leaves the backing until it ends again. A folder without a manifest is closed as
`incomplete` (`close_leftovers`) only once it has been quiet for `LEFTOVER_QUIET_SECONDS`:
before that it may be another replica's live recording.

A manifest holds the SHA-256 of the recording's token (`TOKEN_DIGEST`); `public` leaves it out
of what is served. A token is checked against the digest the index holds, before anything is
read from the backing: an unknown id is compared with a dummy digest, so a known id with a
wrong token and an unknown id cost the same (`authorised`). Every method here that touches the
backing does blocking I/O, so the proxy calls them off its event loop (the recorder's writer
thread, or an executor).
"""

from __future__ import annotations

import hashlib
import heapq
import hmac
import itertools
import json
import logging
import shutil
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import IO, Any

from rtvideo.proxy.recordings import ids
from rtvideo.proxy.recordings.backing import (
    EVENTS,
    FOLDER_BYTES,
    LIVE,
    MANIFEST,
    VIDEO,
    Backing,
    allocated,
    write_private,
)

log = logging.getLogger(__name__)

#: the files a client may download (the manifest is served as JSON by its own endpoint)
DOWNLOADS = {VIDEO: "video/mp4", EVENTS: "application/x-ndjson"}
#: the manifest field holding the SHA-256 (hex) of the recording's token; never served
TOKEN_DIGEST = "recording_token_sha256"
#: a folder without a manifest written to this recently may be live on another proxy (longer
#: than a session's resume grace at its most, 300 s: a detached session writes nothing)
LEFTOVER_QUIET_SECONDS = 600.0
#: at most this often, a token that opens nothing this proxy knows has a backing that cannot tell
#: when its listing changed (`Backing.stamp`: an object store) listed for recordings other
#: replicas finished since (`authorised`)
LEARN_SECONDS = 1.0
#: how often a proxy waiting for another to close a recording it takes over looks again
_POLL_SECONDS = 0.05
#: statuses of a recording that ended short: it is not continued by a takeover
_CLOSED_SHORT = ("failed", "truncated")
#: what a token is compared with when the id is unknown (no token hashes to it)
_DUMMY_DIGEST = "0" * 64


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
    max_count: int = 0  # recordings, live and finished; 0: no count limit


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


def _digest(fields: Mapping[str, Any]) -> str | None:
    found = fields.get(TOKEN_DIGEST)
    return found if isinstance(found, str) else None


@dataclass(frozen=True)
class _Finished:
    """A finished recording in the index."""

    age: float  # unix seconds it counts its age from (its end, else its start, else when indexed)
    size: int  # what it takes on the store (allocated), its manifest included
    digest: str | None  # its token's SHA-256 (None: a recording from before tokens)
    seq: int  # its place in the order by age (an older heap item for the same id is stale)


class RecordingStore:
    """The recordings of one proxy: finished ones in the backing, live ones by their spools."""

    def __init__(self, backing: Backing, limits: Limits) -> None:
        self.backing = backing
        self.limits = limits
        self._live: dict[str, Path] = {}  # id → spool, while its session records
        self._live_manifests: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()  # guards the index and counts below (writer thread, HTTP executors)
        self._live_files: dict[str, dict[str, int]] = {}  # id → file name → bytes written (live)
        self._live_bytes: dict[str, int] = {}  # id → bytes a live recording takes (allocated, charged)
        self._live_total = 0  # the sum of `_live_bytes`
        self._live_digests: dict[str, str | None] = {}
        self._reserved = 0  # recordings admitted (`reserve`) and not yet begun
        # the index of finished recordings: by id, their total, their order by age
        self._finished: dict[str, _Finished] = {}
        self._finished_bytes = 0
        self._order: list[tuple[float, int, str]] = []  # a heap of (age, seq, id); stale items skipped
        self._seq = itertools.count()
        #: recordings other replicas finished on a shared store, learnt for their token digest only
        #: (this proxy neither counts nor evicts them)
        self._learnt: dict[str, str | None] = {}
        self._pending: set[str] = set()  # listed, neither known nor learnt: live elsewhere (`_learn`)
        self._learning = threading.Lock()  # one `_learn` at a time
        self._learnt_at = float("-inf")
        self._stamp: object = None  # the backing's `stamp` when it was last listed

    @property
    def per_recording(self) -> int:
        return min(self.limits.per_recording or self.limits.max_bytes, self.limits.max_bytes)

    # --- admission (the event loop) -------------------------------------------------------------
    def _room(self, more: int) -> bool:
        live = len(self._live) + self._reserved + more
        if self.limits.max_count and live > self.limits.max_count:
            return False
        return self._live_total + (self._reserved + more) * self.per_recording <= self.limits.max_bytes

    def reserve(self) -> bool:
        """A new recording admitted, when there is room for it (the live ones and those admitted
        leave room for it at its cap and in the count; finished ones can be evicted): counted
        until it begins (`begin`) or is let go without a trace (`release`)."""
        with self._lock:
            if not self._room(1):
                return False
            self._reserved += 1
            return True

    def release(self) -> None:
        """An admitted recording that never began (its start was refused before video.start)."""
        with self._lock:
            self._reserved = max(0, self._reserved - 1)

    # --- live recordings (the recorder's writer thread) ----------------------------------------
    def begin(self, rid: str, marker: dict[str, Any]) -> Path:
        """A new live recording's spool, holding its `marker` (LIVE: its start, its token digest);
        the oldest finished recordings go when the count needs room for it."""
        with self._lock:
            self._reserved = max(0, self._reserved - 1)
        spool = self.backing.spool_for(rid)
        self._live_in(rid, spool, marker)
        self.evict()
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
        """A reopened recording (`size` bytes of content) is live here: its manifest leaves the
        backing (another proxy takes it for live, and evicts nothing of it) until it ends again.
        It is counted as its files take the disk."""
        (spool / MANIFEST).unlink(missing_ok=True)
        files = {name: (spool / name).stat().st_size for name in (VIDEO, EVENTS) if (spool / name).exists()}
        self._live_in(rid, spool, marker, files)

    def _live_in(self, rid: str, spool: Path, marker: dict[str, Any], files: dict[str, int] | None = None) -> None:
        text = json.dumps(marker, sort_keys=True)
        write_private(spool / LIVE, text)
        with self._lock:
            self._live[rid] = spool
            self._live_files[rid] = {**(files or {}), LIVE: len(text)}
            self._set_live_bytes(rid, _taken(self._live_files[rid]))
            self._live_digests[rid] = _digest(marker)
            self._drop_finished(rid)
            self._learnt.pop(rid, None)

    def _set_live_bytes(self, rid: str, size: int) -> None:
        """(Under the lock.)"""
        self._live_total += size - self._live_bytes.get(rid, 0)
        self._live_bytes[rid] = size

    def _unmark(self, rid: str, spool: Path) -> None:
        """The marker goes before a manifest is written: a proxy waiting for the manifest to take
        the recording over writes its own marker after, never to see it removed."""
        (spool / LIVE).unlink(missing_ok=True)
        with self._lock:
            files = self._live_files.get(rid)
            if files is not None:
                files.pop(LIVE, None)
                self._set_live_bytes(rid, _taken(files))

    def charge(self, rid: str, writes: Sequence[tuple[str, int]]) -> Charge:
        """Room for the live recording `rid` to append `writes` (file name, bytes): the blocks they
        add are counted when OK, evicting finished recordings (oldest first) when the store would
        go past its bound."""
        with self._lock:
            before = self._live_files.get(rid, {})
            after = dict(before)
            for name, size in writes:
                after[name] = after.get(name, 0) + size
            taken = _taken(after)
            if taken > self.per_recording:
                return Charge.OVER_ITS_CAP
            self._live_files[rid] = after
            self._set_live_bytes(rid, taken)
        self._evict_while(None)
        with self._lock:
            if self._live_total + self._finished_bytes <= self.limits.max_bytes:
                return Charge.OK
            self._live_files[rid] = before
            self._set_live_bytes(rid, _taken(before))
            return Charge.STORE_FULL

    def update_live(self, rid: str, manifest: dict[str, Any]) -> None:
        self._live_manifests[rid] = manifest

    def finish(self, rid: str, manifest: dict[str, Any]) -> None:
        spool = self._live[rid]
        self._unmark(rid, spool)
        write_private(spool / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True))
        self.backing.publish(rid, spool)
        self._forget(rid)
        self._index_one(rid, manifest, self.backing.stored_bytes(rid))

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
                write_private(spool / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True))
                self.backing.publish(rid, spool)
            except OSError:
                shutil.rmtree(spool, ignore_errors=True)
            else:
                self._index_one(rid, manifest, self.backing.stored_bytes(rid))

    def _forget(self, rid: str) -> None:
        with self._lock:
            self._live.pop(rid, None)
            self._live_files.pop(rid, None)
            self._set_live_bytes(rid, 0)
            self._live_bytes.pop(rid, None)
            self._live_digests.pop(rid, None)
        self._live_manifests.pop(rid, None)

    def live_bytes(self) -> int:
        with self._lock:
            return self._live_total

    def total_bytes(self) -> int:
        """What this store's recordings take on its disk, live ones included (as counted)."""
        with self._lock:
            return self._live_total + self._finished_bytes

    def count(self) -> int:
        """This store's recordings, live and finished (as counted)."""
        with self._lock:
            return len(self._live) + len(self._finished)

    # --- the index ---------------------------------------------------------------------------------
    def _index_one(self, rid: str, manifest: Mapping[str, Any], size: int, seen: float | None = None) -> None:
        """A finished recording enters the index (or takes its place there again)."""
        age = float(manifest.get("ended_at") or 0.0) or float(manifest.get("started_at") or 0.0)
        entry = _Finished(age or (seen if seen is not None else time.time()), size, _digest(manifest), next(self._seq))
        with self._lock:
            self._drop_finished(rid)
            self._finished[rid] = entry
            self._finished_bytes += entry.size
            heapq.heappush(self._order, (entry.age, entry.seq, rid))
            self._learnt.pop(rid, None)

    def _drop_finished(self, rid: str) -> _Finished | None:
        """(Under the lock.) A finished recording out of the index; its heap item goes stale."""
        gone = self._finished.pop(rid, None)
        if gone is not None:
            self._finished_bytes -= gone.size
            if len(self._order) > 2 * len(self._finished) + 64:  # mostly stale: rebuilt (amortised O(1))
                self._order = [(e.age, e.seq, r) for r, e in self._finished.items()]
                heapq.heapify(self._order)
        return gone

    def _oldest(self) -> tuple[str, _Finished] | None:
        """(Under the lock.) The oldest finished recording, stale heap items dropped on the way."""
        while self._order:
            _, seq, rid = self._order[0]
            entry = self._finished.get(rid)
            if entry is not None and entry.seq == seq:
                return rid, entry
            heapq.heappop(self._order)
        return None

    def index(self) -> None:
        """Count the finished recordings on the backing (at start: what earlier runs left): one
        listing, and each recording's manifest and size read once."""
        now = time.time()
        for rid in self.backing.ids():
            if rid in self._live:
                continue
            text = self.backing.read_text(rid, MANIFEST)
            if text is None:
                continue  # live elsewhere, or a leftover (`close_leftovers`)
            self._index_one(rid, _fields(text), self.backing.stored_bytes(rid), seen=now)

    def _over(self, now: float | None, entry: _Finished) -> bool:
        """(Under the lock.) Whether the bounds want the oldest finished recording (`entry`) gone."""
        if self._live_total + self._finished_bytes > self.limits.max_bytes:
            return True
        if self.limits.max_count and len(self._live) + len(self._finished) > self.limits.max_count:
            return True
        max_age = self.limits.max_age or 0.0
        return now is not None and max_age > 0 and now - entry.age > max_age

    def _evict_while(self, now: float | None) -> list[str]:
        """The oldest finished recordings removed while the bounds want them gone (`_over`; `now`
        None: the age is not looked at); the ids removed. Each step costs the recording it removes."""
        removed: list[str] = []
        while True:
            with self._lock:
                oldest = self._oldest()
                if oldest is None or not self._over(now, oldest[1]):
                    return removed
                rid = oldest[0]
                self._drop_finished(rid)
            if self._remove_files(rid):
                removed.append(rid)
                log.info("recordings: %s evicted to keep the store within its bounds", rid)

    def evict(self, now: float | None = None) -> list[str]:
        """Finished recordings past `max_age`, then the oldest until all (live ones included) fit
        in `max_bytes` and `max_count`; returns the ids removed."""
        return self._evict_while(time.time() if now is None else now)

    # --- finding, reading, deleting --------------------------------------------------------------
    def manifest(self, rid: str) -> dict[str, Any] | None:
        ids.check(rid)
        live = self._live_manifests.get(rid)
        if live is not None:
            return dict(live)
        text = self.backing.read_text(rid, MANIFEST)
        return None if text is None else json.loads(text)

    def _known_digest(self, rid: str) -> str | None:
        with self._lock:
            if rid in self._live_digests:
                return self._live_digests[rid]
            entry = self._finished.get(rid)
            if entry is not None:
                return entry.digest
            return self._learnt.get(rid)

    def _token_opens(self, rid: str, presented: str) -> bool:
        """Whether `presented` (a token's digest) is the digest this proxy knows for `rid`: the
        same comparison, in memory, whether the id is known or not."""
        known = self._known_digest(rid)
        same = hmac.compare_digest(known if known is not None else _DUMMY_DIGEST, presented)
        return same and known is not None

    def authorised(self, rid: str, token: str | None) -> dict[str, Any] | None:
        """The manifest of `rid` when `token` is its recording's token; None otherwise (no such
        recording, no token, another's token, or a recording made before tokens existed).

        The token is checked against the index before anything is read: a wrong token for a
        known id and any token for an unknown one take the same steps. A token that opens nothing
        known here has the backing listed for recordings other replicas finished since
        (`_learn`, at most every `LEARN_SECONDS`, whatever the id), then is checked again."""
        ids.check(rid)
        presented = token_digest(token) if token is not None else _DUMMY_DIGEST
        opens = token is not None and self._token_opens(rid, presented)
        if not opens and token is not None:
            self._learn()
            opens = self._token_opens(rid, presented)
        return self.manifest(rid) if opens else None

    def _learn(self) -> None:
        """Recordings on the backing that this proxy neither made nor indexed (another replica
        finished them on a shared store): their digests learnt, for `authorised`. The work does
        not depend on the id asked for: the backing is listed again only when its listing
        changed (`Backing.stamp`; a backing that cannot tell is listed at most every
        `LEARN_SECONDS`), and the manifests of the recordings listed but not yet finished (live
        elsewhere) are looked for. One caller at a time."""
        with self._learning:
            stamp = self.backing.stamp()
            stale = stamp != self._stamp if stamp is not None else time.monotonic() - self._learnt_at >= LEARN_SECONDS
            if stale:
                self._learnt_at = time.monotonic()
                self._stamp = stamp
                listed = set(self.backing.ids())
                with self._lock:
                    known = set(self._finished) | set(self._live)
                    self._learnt = {rid: d for rid, d in self._learnt.items() if rid in listed}
                    self._pending = listed - known - set(self._learnt)
            found = {}
            for rid in sorted(self._pending):
                text = self.backing.read_text(rid, MANIFEST)
                if text is not None:
                    found[rid] = _digest(_fields(text))
            with self._lock:
                for rid, digest in found.items():
                    self._pending.discard(rid)
                    if rid not in self._finished and rid not in self._live:
                        self._learnt[rid] = digest

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
        with self._lock:
            self._drop_finished(rid)
        self._remove_files(rid)
        return True

    def _remove_files(self, rid: str) -> bool:
        """A finished recording's files gone (it has left the index). False when it is not
        finished any more (a takeover reopened it on another proxy): it stays."""
        with self._lock:
            self._learnt.pop(rid, None)
        if self.backing.read_text(rid, MANIFEST) is None:
            return False
        self.backing.remove(rid)
        return True

    def close_leftovers(self, now: float | None = None) -> list[str]:
        """Folders a killed proxy left without a manifest: closed as `incomplete` (their files
        kept; their marker's start and token digest in the manifest) and indexed, so nothing is
        lost and the bounds count them. One written to in the last `LEFTOVER_QUIET_SECONDS` may be
        live on another proxy sharing the store (or just begun, its marker not yet written): it is
        left for a later pass. Recordings in the index are finished: only the others are read."""
        now = time.time() if now is None else now
        closed = []
        for rid in self.backing.ids():
            with self._lock:
                known = rid in self._live or rid in self._finished
            if known or self.backing.read_text(rid, MANIFEST) is not None:
                continue
            if now - self.backing.touched(rid) < LEFTOVER_QUIET_SECONDS:
                continue  # written to lately: maybe live elsewhere (its marker may not be written yet)
            marker = _fields(self.backing.read_text(rid, LIVE))
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
            self._index_one(rid, manifest, self.backing.stored_bytes(rid), seen=now)
            closed.append(rid)
        return closed


def _taken(files: Mapping[str, int]) -> int:
    """What a live recording of these files (name → bytes) takes on the disk: its folder's block
    and each file's blocks (`allocated`)."""
    return FOLDER_BYTES + sum(allocated(size) for size in files.values())


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
