"""Where recordings live (`--recordings`), and the only code that touches their files.

A recording is a folder named by its id (`ids`) holding `video.mp4`, `events.jsonl` and
`manifest.json` (FILES): nothing a client names becomes a path except through `ids.check`.

Two backings, one interface (`Backing`):
- a local directory: a live recording is written in place (its folder has no manifest until it
  ends; one left without a manifest by a killed proxy is closed as `incomplete` at start);
- an fsspec URL (`s3://bucket/prefix`, `memory://...`; the `recordings` extra): a live
  recording is spooled in a local temporary folder and uploaded when it ends.

Bounds (`Limits`), counted over everything written (video, event log, manifest, a spool):
- every byte a live recording writes is charged first (`charge`, on the writer thread, before
  the write); a charge that would take the store past `max_bytes` evicts finished recordings,
  oldest first, and when none is left to evict, or the recording is past its own cap
  (`per_recording`), the charge is refused and the recorder closes the recording there
  (`truncated`); so the store stays within `max_bytes`;
- a new recording is admitted only while the live ones leave room for it at its cap
  (`room_for_new`); finished ones past `max_age` go too;
- a live recording is never evicted.
The counts are this process's (an index of the finished recordings, built at start): a store
shared by several proxies is bounded per proxy (docs/recordings.md).

On a local store folders are 0700 and files 0600: only the proxy's user reads what was said.
A manifest holds the SHA-256 of the recording's token (`TOKEN_DIGEST`); `public` leaves it out
of what is served. Every method here does blocking I/O, so the proxy calls them off its event
loop (the recorder's writer thread, or an executor).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import IO, Any, Protocol

from rtvideo.proxy.recordings import ids

log = logging.getLogger(__name__)

VIDEO = "video.mp4"
EVENTS = "events.jsonl"
MANIFEST = "manifest.json"
FILES = (VIDEO, EVENTS, MANIFEST)
#: the files a client may download (the manifest is served as JSON by its own endpoint)
DOWNLOADS = {VIDEO: "video/mp4", EVENTS: "application/x-ndjson"}
#: the manifest field holding the SHA-256 (hex) of the recording's token; never served
TOKEN_DIGEST = "recording_token_sha256"
#: modes of what a local store creates: the proxy's user alone
FOLDER_MODE = 0o700
FILE_MODE = 0o600


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def public(manifest: dict[str, Any]) -> dict[str, Any]:
    """A manifest as served: without its token's digest."""
    return {k: v for k, v in manifest.items() if k != TOKEN_DIGEST}


def private_folder(path: Path) -> None:
    """`path` as a folder only the proxy's user may enter (made if missing, tightened if not)."""
    path.mkdir(mode=FOLDER_MODE, parents=True, exist_ok=True)
    os.chmod(path, FOLDER_MODE)


def open_private(path: Path, append: bool = True) -> IO[bytes]:
    """`path` opened for writing, created 0600 (whatever the umask)."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
    fd = os.open(path, flags, FILE_MODE)
    os.fchmod(fd, FILE_MODE)
    return os.fdopen(fd, "ab" if append else "wb")


def write_private(path: Path, text: str) -> None:
    """`text` into `path` whole: written to a partial file (0600) first, so no reader sees half."""
    partial = path.with_suffix(".partial")
    with open_private(partial, append=False) as f:
        f.write(text.encode("utf-8"))
    partial.replace(path)


class Backing(Protocol):
    """The files of finished recordings."""

    def ids(self) -> list[str]: ...

    def read_text(self, rid: str, name: str) -> str | None:
        """The file's text; None when it does not exist."""
        ...

    def open(self, rid: str, name: str) -> tuple[IO[bytes], int] | None:
        """The file open for reading, and its size; None when it does not exist."""
        ...

    def write_text(self, rid: str, name: str, text: str) -> None: ...

    def publish(self, rid: str, spool: Path) -> None:
        """A finished recording's spool (its folder while live) becomes the recording."""
        ...

    def remove(self, rid: str) -> None: ...

    def spool_for(self, rid: str) -> Path:
        """Where a live recording is written."""
        ...


class LocalBacking:
    def __init__(self, root: Path) -> None:
        self.root = root
        try:
            private_folder(root)
        except PermissionError:  # a folder the operator made and owns: kept as it is, said once
            log.warning("recordings: %s could not be made private (0700); its recordings still are", root)

    def _folder(self, rid: str) -> Path:
        return self.root / ids.check(rid)

    def ids(self) -> list[str]:
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and ids.ID_PATTERN.fullmatch(p.name))

    def read_text(self, rid: str, name: str) -> str | None:
        try:
            return (self._folder(rid) / name).read_text()
        except FileNotFoundError:
            return None

    def open(self, rid: str, name: str) -> tuple[IO[bytes], int] | None:
        try:
            f = (self._folder(rid) / name).open("rb")
        except FileNotFoundError:
            return None
        return f, Path(f.name).stat().st_size

    def write_text(self, rid: str, name: str, text: str) -> None:
        write_private(self._folder(rid) / name, text)

    def publish(self, rid: str, spool: Path) -> None:
        pass  # written in place

    def remove(self, rid: str) -> None:
        shutil.rmtree(self._folder(rid), ignore_errors=True)

    def spool_for(self, rid: str) -> Path:
        folder = self._folder(rid)
        folder.mkdir(mode=FOLDER_MODE, exist_ok=False)
        os.chmod(folder, FOLDER_MODE)
        return folder


class FsspecBacking:
    """A store at an fsspec URL; live recordings spool locally (objects cannot be appended to)."""

    def __init__(self, url: str) -> None:
        try:
            import fsspec
        except ImportError as exc:
            raise ValueError(
                f"--recordings {url}: a URL store needs fsspec (pip install 'rtvideo[recordings]')"
            ) from exc
        self.fs, self.prefix = fsspec.core.url_to_fs(url)
        self.fs.makedirs(self.prefix, exist_ok=True)

    def _path(self, rid: str, name: str | None = None) -> str:
        folder = f"{self.prefix.rstrip('/')}/{ids.check(rid)}"
        return folder if name is None else f"{folder}/{name}"

    def ids(self) -> list[str]:
        names = (str(p).rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(self.prefix, detail=False))
        return sorted(n for n in names if ids.ID_PATTERN.fullmatch(n))

    def read_text(self, rid: str, name: str) -> str | None:
        try:
            return str(self.fs.cat_file(self._path(rid, name)).decode("utf-8"))
        except FileNotFoundError:
            return None

    def open(self, rid: str, name: str) -> tuple[IO[bytes], int] | None:
        path = self._path(rid, name)
        try:
            size = int(self.fs.size(path))
            return self.fs.open(path, "rb"), size
        except FileNotFoundError:
            return None

    def write_text(self, rid: str, name: str, text: str) -> None:
        self.fs.pipe_file(self._path(rid, name), text.encode("utf-8"))

    def publish(self, rid: str, spool: Path) -> None:
        for name in FILES:
            if (spool / name).exists():
                self.fs.put_file(str(spool / name), self._path(rid, name))
        shutil.rmtree(spool, ignore_errors=True)

    def remove(self, rid: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm(self._path(rid), recursive=True)

    def spool_for(self, rid: str) -> Path:
        return Path(tempfile.mkdtemp(prefix=f"rtvideo-recording-{ids.check(rid)}-"))


def backing_for(location: str) -> Backing:
    """A directory (a plain path or `file://`), else an fsspec URL."""
    if "://" in location and not location.startswith("file://"):
        return FsspecBacking(location)
    return LocalBacking(Path(location.removeprefix("file://")).expanduser())


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

    def begin(self, rid: str) -> Path:
        spool = self.backing.spool_for(rid)
        with self._lock:
            self._live[rid] = spool
            self._live_bytes.setdefault(rid, 0)
        return spool

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

    def _remove(self, rid: str) -> int:
        """A finished recording gone; the bytes it took."""
        self.backing.remove(rid)
        with self._lock:
            gone = self._finished.pop(rid, None)
        return gone.size if gone is not None else 0

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
            freed += self._remove(rid)
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
            if old or self.total_bytes() > self.limits.max_bytes:
                self._remove(rid)
                removed.append(rid)
        return removed

    def close_leftovers(self) -> list[str]:
        """Folders a killed proxy left without a manifest: closed as `incomplete` (their files
        kept), so nothing is lost and the bounds count them."""
        closed = []
        for rid in self.backing.ids():
            if rid in self._live or self.backing.read_text(rid, MANIFEST) is not None:
                continue
            size = 0
            for name in (VIDEO, EVENTS):
                opened = self.backing.open(rid, name)
                if opened is not None:
                    opened[0].close()
                    size += opened[1]
            manifest = {"recording_id": rid, "status": "incomplete", "bytes": size, "started_at": 0.0}
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
