"""Where a recording's files are: the only code that touches them (rtvideo.proxy.recordings.store
decides what is written, kept and removed).

A recording is a folder named by its id (`ids`) holding `video.mp4`, `events.jsonl` and
`manifest.json` (FILES): nothing a client names becomes a path except through `ids.check`.
While live it also holds `live.json` (LIVE: when it began and its token's digest), which
outlives a killed proxy, so a replica that takes the session over, or closes what was left,
knows the recording's start and who may read it (docs/recordings.md "Recordings across
replicas").

Two backings, one interface (`Backing`):
- a local directory (shared by replicas through one host's disk, or an NFS or ReadWriteMany
  volume): a live recording is written in place;
- an fsspec URL (`s3://bucket/prefix`, `memory://...`; the `recordings` extra): objects cannot
  be appended to, so a live recording is spooled in a local temporary folder and uploaded when
  it ends (and one taken over is fetched into a spool again).

On a local store folders are 0700 and files 0600: only the proxy's user reads what was said.
What a recording takes (`stored_bytes`) is what it takes on the disk, not its content: a local
store's allocated blocks (`st_blocks`), a file at least one block and its folder one more; an
object store, which has no blocks to tell, each object rounded up to `BLOCK_BYTES` (`allocated`):
thousands of tiny recordings take thousands of blocks, and are counted so.
Every method does blocking I/O: the proxy calls them off its event loop.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import IO, Protocol

from rtvideo.proxy.recordings import ids
from rtvideo.redaction import redact_url

log = logging.getLogger(__name__)

VIDEO = "video.mp4"
EVENTS = "events.jsonl"
MANIFEST = "manifest.json"
FILES = (VIDEO, EVENTS, MANIFEST)
#: a live recording's marker (its start and token digest); gone once it has a manifest
LIVE = "live.json"
#: modes of what a local store creates: the proxy's user alone
FOLDER_MODE = 0o700
FILE_MODE = 0o600
#: the unit a file takes the disk in where the store cannot say (an object store), and the least
#: any file is counted as (an empty or tiny file still takes an inode and a block's worth)
BLOCK_BYTES = 4096
#: what a recording's folder (or spool) is counted as besides its files
FOLDER_BYTES = BLOCK_BYTES


def allocated(size: int) -> int:
    """What a file of `size` bytes is counted as taking: whole blocks, at least one."""
    return max(BLOCK_BYTES, -(-size // BLOCK_BYTES) * BLOCK_BYTES)


def _on_disk(path: Path) -> int:
    """What a local file or folder takes: its allocated blocks, at least one block."""
    return max(BLOCK_BYTES, path.stat().st_blocks * 512)


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
    write_private_bytes(path, text.encode("utf-8"))


def write_private_bytes(path: Path, data: bytes) -> None:
    """`data` into `path` whole (a partial file, 0600, renamed over it: no reader sees half)."""
    partial = path.with_suffix(".partial")
    with open_private(partial, append=False) as f:
        f.write(data)
    partial.replace(path)


class Backing(Protocol):
    """The files of recordings."""

    def ids(self) -> list[str]: ...

    def read_text(self, rid: str, name: str) -> str | None:
        """The file's text; None when it does not exist."""
        ...

    def open(self, rid: str, name: str) -> tuple[IO[bytes], int] | None:
        """The file open for reading, and its size; None when it does not exist."""
        ...

    def write_text(self, rid: str, name: str, text: str) -> None: ...

    def write_bytes(self, rid: str, name: str, data: bytes) -> None:
        """`data` as the whole file `name` (made with its folder if missing): a reader sees the
        old file or the new one, never half (a rename on a disk, one put on an object store)."""
        ...

    def remove_file(self, rid: str, name: str) -> None:
        """One file of a recording gone (none: nothing to do)."""
        ...

    def stamp(self) -> object:
        """Something that changes whenever a recording is added to or removed from the store; None
        when the store cannot tell (it is listed to know)."""
        ...

    def stored_bytes(self, rid: str) -> int:
        """What the recording takes on the store (see the module docstring); 0 when it is gone."""
        ...

    def touched(self, rid: str) -> float:
        """Unix time of the recording's last write (0.0: unknown)."""
        ...

    def publish(self, rid: str, spool: Path) -> None:
        """A finished recording's spool (its folder while live) becomes the recording."""
        ...

    def remove(self, rid: str) -> None: ...

    def spool_for(self, rid: str) -> Path:
        """Where a new live recording is written."""
        ...

    def spool_again(self, rid: str) -> Path | None:
        """Where a recording that another proxy began is appended to, holding its files as the
        backing has them; None when the backing has no such recording."""
        ...

    def discard_spool(self, spool: Path) -> None:
        """A spool of `spool_again` that will not be published (the recording stays as it was)."""
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

    def write_bytes(self, rid: str, name: str, data: bytes) -> None:
        folder = self._folder(rid)
        if not folder.is_dir():
            private_folder(folder)
        write_private_bytes(folder / name, data)

    def remove_file(self, rid: str, name: str) -> None:
        (self._folder(rid) / name).unlink(missing_ok=True)

    def stamp(self) -> object:
        found = self.root.stat()
        return (found.st_mtime_ns, found.st_nlink)  # a folder made or removed changes both

    def stored_bytes(self, rid: str) -> int:
        folder = self._folder(rid)
        total = 0
        with contextlib.suppress(FileNotFoundError):
            total += _on_disk(folder)
            for path in folder.iterdir():
                with contextlib.suppress(FileNotFoundError):
                    total += _on_disk(path)
        return total

    def touched(self, rid: str) -> float:
        folder = self._folder(rid)
        times = [0.0]
        for path in (folder, *(folder / name for name in (*FILES, LIVE))):
            with contextlib.suppress(FileNotFoundError):
                times.append(path.stat().st_mtime)
        return max(times)

    def publish(self, rid: str, spool: Path) -> None:
        pass  # written in place

    def remove(self, rid: str) -> None:
        shutil.rmtree(self._folder(rid), ignore_errors=True)

    def spool_for(self, rid: str) -> Path:
        folder = self._folder(rid)
        folder.mkdir(mode=FOLDER_MODE, exist_ok=False)
        os.chmod(folder, FOLDER_MODE)
        return folder

    def spool_again(self, rid: str) -> Path | None:
        folder = self._folder(rid)
        return folder if folder.is_dir() else None

    def discard_spool(self, spool: Path) -> None:
        pass  # the recording's own folder


class FsspecBacking:
    """A store at an fsspec URL; live recordings spool locally (objects cannot be appended to)."""

    def __init__(self, url: str) -> None:
        try:
            import fsspec
        except ImportError as exc:
            raise ValueError(
                f"--recordings {redact_url(url)}: a URL store needs fsspec (pip install 'rtvideo[recordings]')"
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

    def write_bytes(self, rid: str, name: str, data: bytes) -> None:
        self.fs.pipe_file(self._path(rid, name), data)

    def remove_file(self, rid: str, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm(self._path(rid, name))

    def stamp(self) -> object:
        return None  # an object store has no cheap way to tell

    def stored_bytes(self, rid: str) -> int:
        try:
            found = self.fs.ls(self._path(rid), detail=True)
        except FileNotFoundError:
            return 0
        return sum(allocated(int(f.get("size") or 0)) for f in found if f.get("type") != "directory")

    def touched(self, rid: str) -> float:
        return 0.0  # a live recording is in its proxy's spool: what the bucket holds is never live

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

    def spool_again(self, rid: str) -> Path | None:
        """The published files fetched into a new spool (the bucket keeps its copy until the
        recording is published again, whole)."""
        found = [name for name in (VIDEO, EVENTS) if self.fs.exists(self._path(rid, name))]
        if not found:
            return None
        spool = self.spool_for(rid)
        for name in found:
            self.fs.get_file(self._path(rid, name), str(spool / name))
            os.chmod(spool / name, FILE_MODE)
        return spool

    def discard_spool(self, spool: Path) -> None:
        shutil.rmtree(spool, ignore_errors=True)


def backing_for(location: str) -> Backing:
    """A directory (a plain path or `file://`), else an fsspec URL."""
    if "://" in location and not location.startswith("file://"):
        return FsspecBacking(location)
    return LocalBacking(Path(location.removeprefix("file://")).expanduser())
