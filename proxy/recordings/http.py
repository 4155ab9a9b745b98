"""`/v1/recordings` (docs/recordings.md), behind the same `--token` as sessions.

- `GET /v1/recordings`: `{"object": "list", "data": [manifest, ...]}`, the newest first.
- `GET /v1/recordings/{id}`: the manifest. `DELETE` it: 204 (a live one: 409).
- `GET /v1/recordings/{id}/video.mp4` and `.../events.jsonl`: the files (a single byte
  `Range` honoured, so a player can seek).
A malformed id is 400, an unknown one 404; the id is checked before anything reaches the
store (`ids.check`), and the file names are fixed, so no request names a path. Store I/O runs
in an executor, never on the event loop.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import tornado.web

from rtvideo.proxy.access import refused_without_token
from rtvideo.proxy.recordings import ids
from rtvideo.proxy.recordings.service import Recordings
from rtvideo.proxy.recordings.store import DOWNLOADS, read_chunks

PREFIX = "/v1/recordings"
_RANGE = re.compile(r"bytes=(\d*)-(\d*)")


class _RecordingsHandler(tornado.web.RequestHandler):
    def initialize(self, recordings: Recordings | None, token: str | None) -> None:
        self.recordings = recordings
        self.token = token

    def prepare(self) -> None:
        self.set_header("Cache-Control", "no-store")
        if refused_without_token(self, self.token):
            return
        if self.recordings is None:
            self._json(404, {"error": "recordings are off on this server (rtvideo serve --recordings)"})

    def _json(self, status: int, body: Any) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(body))

    def _checked(self, rid: str) -> str | None:
        try:
            return ids.check(rid)
        except ids.MalformedId as exc:
            self._json(400, {"error": str(exc)})
            return None

    async def _io(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


class RecordingListHandler(_RecordingsHandler):
    async def get(self) -> None:
        assert self.recordings is not None
        self._json(200, {"object": "list", "data": await self._io(self.recordings.store.manifests)})


class RecordingHandler(_RecordingsHandler):
    async def get(self, rid: str) -> None:
        if (checked := self._checked(rid)) is None:
            return
        assert self.recordings is not None
        manifest = await self._io(self.recordings.store.manifest, checked)
        if manifest is None:
            self._json(404, {"error": f"no recording {checked}"})
        else:
            self._json(200, manifest)

    async def delete(self, rid: str) -> None:
        if (checked := self._checked(rid)) is None:
            return
        assert self.recordings is not None
        store = self.recordings.store
        manifest = await self._io(store.manifest, checked)
        if manifest is None:
            self._json(404, {"error": f"no recording {checked}"})
        elif not await self._io(store.delete, checked):
            self._json(409, {"error": f"recording {checked} is still being recorded"})
        else:
            self.set_status(204)
            self.finish()


class RecordingFileHandler(_RecordingsHandler):
    async def get(self, rid: str, name: str) -> None:
        if (checked := self._checked(rid)) is None:
            return
        assert self.recordings is not None
        opened = await self._io(self.recordings.store.open, checked, name)
        if opened is None:
            self._json(404, {"error": f"no recording {checked}"})
            return
        f, size = opened
        try:
            start, length = self._range(size)
            if length < 0:
                self.set_header("Content-Range", f"bytes */{size}")
                self._json(416, {"error": "the range is outside the file"})
                return
            self.set_header("Content-Type", DOWNLOADS[name])
            self.set_header("Accept-Ranges", "bytes")
            self.set_header("Content-Length", str(length))
            if (start, length) != (0, size):
                self.set_status(206)
                self.set_header("Content-Range", f"bytes {start}-{start + length - 1}/{size}")
            pieces = read_chunks(f, start, length)
            while (piece := await self._io(next, pieces, None)) is not None:
                self.write(piece)
                await self.flush()
            self.finish()
        finally:
            f.close()

    def _range(self, size: int) -> tuple[int, int]:
        """(start, length) of the one range asked for (the whole file without one); length -1
        when it cannot be served."""
        header = self.request.headers.get("Range")
        match = _RANGE.fullmatch(header.strip()) if header else None
        if match is None:
            return 0, size
        first, last = match.groups()
        if not first:  # the last N bytes
            n = min(int(last or 0), size)
            return size - n, n if n > 0 else -1
        start = int(first)
        end = min(int(last), size - 1) if last else size - 1
        return (start, end - start + 1) if start <= end else (0, -1)


def routes(recordings: Recordings | None, token: str | None) -> list[tuple[str, type, dict[str, Any]]]:
    args = {"recordings": recordings, "token": token}
    files = "|".join(re.escape(name) for name in DOWNLOADS)
    return [
        (PREFIX, RecordingListHandler, args),
        (rf"{PREFIX}/([^/]+)", RecordingHandler, args),
        (rf"{PREFIX}/([^/]+)/({files})", RecordingFileHandler, args),
    ]
