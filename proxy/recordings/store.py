"""Where recordings live (`--recordings`), and the only code that touches their files.

A recording is a folder named by its id (`ids`) holding `video.mp4`, `events.jsonl` and
`manifest.json` (FILES): nothing a client names becomes a path except through `ids.check`.

Two backings, one interface (`Backing`):
- a local directory: a live recording is written in place (its folder has no manifest until it
  ends; one left without a manifest by a killed proxy is closed as `incomplete` at start);
- an fsspec URL (`s3://bucket/prefix`, `memory://...`; the `recordings` extra): a live
  recording is spooled in a local temporary folder and uploaded when it ends.

Invariants: a live recording is never evicted; `evict` keeps the finished ones within
`max_bytes` (oldest first) and `max_age`; every method here does blocking I/O, so the proxy
calls them off its event loop (the recorder's writer thread, or an executor).
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
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
        root.mkdir(parents=True, exist_ok=True)

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
        path = self._folder(rid) / name
        partial = path.with_suffix(".partial")
        partial.write_text(text)
        partial.replace(path)  # a reader never sees half a manifest

    def publish(self, rid: str, spool: Path) -> None:
        pass  # written in place

    def remove(self, rid: str) -> None:
        shutil.rmtree(self._folder(rid), ignore_errors=True)

    def spool_for(self, rid: str) -> Path:
        folder = self._folder(rid)
        folder.mkdir(parents=True, exist_ok=False)
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


class RecordingStore:
    """The recordings of one proxy: finished ones in the backing, live ones by their spools."""

    def __init__(self, backing: Backing, limits: Limits) -> None:
        self.backing = backing
        self.limits = limits
        self._live: dict[str, Path] = {}  # id → spool, while its session records
        self._live_manifests: dict[str, dict[str, Any]] = {}

    # --- live recordings (the recorder's writer thread) ----------------------------------------
    def begin(self, rid: str) -> Path:
        spool = self.backing.spool_for(rid)
        self._live[rid] = spool
        return spool

    def update_live(self, rid: str, manifest: dict[str, Any]) -> None:
        self._live_manifests[rid] = manifest

    def finish(self, rid: str, manifest: dict[str, Any]) -> None:
        spool = self._live[rid]
        (spool / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
        self.backing.publish(rid, spool)
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
                (spool / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
                self.backing.publish(rid, spool)
            except OSError:
                shutil.rmtree(spool, ignore_errors=True)

    def _forget(self, rid: str) -> None:
        self._live.pop(rid, None)
        self._live_manifests.pop(rid, None)

    def live_bytes(self) -> int:
        return sum(int(m.get("bytes", 0)) for m in list(self._live_manifests.values()))

    # --- finding, reading, deleting --------------------------------------------------------------
    def manifest(self, rid: str) -> dict[str, Any] | None:
        ids.check(rid)
        live = self._live_manifests.get(rid)
        if live is not None:
            return dict(live)
        text = self.backing.read_text(rid, MANIFEST)
        return None if text is None else json.loads(text)

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
        self.backing.remove(rid)
        return True

    # --- bounds ----------------------------------------------------------------------------------
    def evict(self, now: float | None = None) -> list[str]:
        """Finished recordings past `max_age`, then the oldest until all (live ones included) fit
        in `max_bytes`; returns the ids removed."""
        now = time.time() if now is None else now
        finished = [m for m in self.manifests() if m.get("recording_id") not in self._live]
        finished.sort(key=lambda m: m.get("started_at", 0.0))
        removed: list[str] = []
        total = self.live_bytes() + sum(int(m.get("bytes", 0)) for m in finished)
        for m in finished:
            old = self.limits.max_age > 0 and now - float(m.get("ended_at") or m.get("started_at") or now) > (
                self.limits.max_age
            )
            if old or total > self.limits.max_bytes:
                self.backing.remove(m["recording_id"])
                total -= int(m.get("bytes", 0))
                removed.append(m["recording_id"])
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
