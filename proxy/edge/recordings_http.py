"""`/v1/recordings` (docs/recordings.md; who may do what: docs/security.md "Credentials").

- `GET /v1/recordings`: `{"object": "list", "data": [manifest, ...]}`, the newest first: the
  operator's alone (`--admin-token`; 403 otherwise).
- `GET /v1/recordings/{id}`: the manifest. `DELETE` it: 204 (a live one: 409).
- `GET /v1/recordings/{id}/video.mp4` and `.../events.jsonl`: the files (a single byte
  `Range` honoured, so a player can seek; a range that cannot be read is 416).
One recording is opened by its recording token (`Authorization: Bearer` or
`?recording_token=`) or by the operator's credential; without either it is 404, as an
unknown id is, so a stranger learns nothing of it. The client's `--token` still guards every
route (the operator's credential passes it). A `DELETE` refuses a foreign Origin and any body.
A malformed id is 400; the id is checked before anything reaches the store (`ids.check`), and
the file names are fixed, so no request names a path. Store I/O runs in an executor, never on
the event loop. Manifests are served without their token's digest (`store.public`).
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import tornado.web

from rtvideo.proxy.edge.access import bearer, is_operator, query_value, refused_unsafe_request, refused_without_token
from rtvideo.proxy.recordings import ids
from rtvideo.proxy.recordings.service import Recordings
from rtvideo.proxy.recordings.store import DOWNLOADS, public, read_chunks
from rtvideo.proxy.settings import ProxySettings

PREFIX = "/v1/recordings"
#: a byte range: each bound at most 18 digits (any file size fits; a longer number is refused, not parsed)
_RANGE = re.compile(r"bytes=(\d{0,18})-(\d{0,18})")


class _RecordingsHandler(tornado.web.RequestHandler):
    def initialize(self, recordings: Recordings | None, settings: ProxySettings) -> None:
        self.recordings = recordings
        self.proxy_settings = settings
        self.operator = False

    def prepare(self) -> None:
        self.set_header("Cache-Control", "no-store")
        self.operator = is_operator(self.request, self.proxy_settings.admin_token)
        if not self.operator and refused_without_token(self, self.proxy_settings.token):
            return
        if self.request.method == "DELETE" and refused_unsafe_request(self, self.proxy_settings.allowed_origins):
            return
        if self.recordings is None:
            self._json(404, {"error": "recordings are off on this server (rtvideo serve --recordings)"})

    async def _manifest(self, rid: str) -> dict[str, Any] | None:
        """The recording's manifest when this request may open it (the operator, or its token);
        None otherwise, as for an unknown id."""
        assert self.recordings is not None
        store = self.recordings.store
        if self.operator:
            return await self._io(store.manifest, rid)
        for presented in {query_value(self.request, "recording_token"), bearer(self.request)} - {None}:
            manifest = await self._io(store.authorised, rid, presented)
            if manifest is not None:
                return manifest
        return None

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
        if not self.operator:
            why = (
                "this proxy has no --admin-token" if self.proxy_settings.admin_token is None else "send it as a bearer"
            )
            self._json(
                403,
                {
                    "error": f"the full listing needs the operator's credential ({why}); "
                    "read each recording you hold a token for by its id"
                },
            )
            return
        manifests = await self._io(self.recordings.store.manifests)
        self._json(200, {"object": "list", "data": [public(m) for m in manifests]})


class RecordingHandler(_RecordingsHandler):
    async def get(self, rid: str) -> None:
        if (checked := self._checked(rid)) is None:
            return
        manifest = await self._manifest(checked)
        if manifest is None:
            self._json(404, {"error": f"no recording {checked}"})
        else:
            self._json(200, public(manifest))

    async def delete(self, rid: str) -> None:
        if (checked := self._checked(rid)) is None:
            return
        assert self.recordings is not None
        store = self.recordings.store
        manifest = await self._manifest(checked)
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
        manifest = await self._manifest(checked)
        opened = await self._io(self.recordings.store.open, checked, name) if manifest is not None else None
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
        if header is None:
            return 0, size
        match = _RANGE.fullmatch(header.strip())
        if match is None or match.groups() == ("", ""):
            return 0, -1  # not one byte range this server reads
        first, last = match.groups()
        if not first:  # the last N bytes
            n = min(int(last or 0), size)
            return size - n, n if n > 0 else -1
        start = int(first)
        end = min(int(last), size - 1) if last else size - 1
        return (start, end - start + 1) if start <= end else (0, -1)


def routes(recordings: Recordings | None, settings: ProxySettings) -> list[tuple[str, type, dict[str, Any]]]:
    args = {"recordings": recordings, "settings": settings}
    files = "|".join(re.escape(name) for name in DOWNLOADS)
    return [
        (PREFIX, RecordingListHandler, args),
        (rf"{PREFIX}/([^/]+)", RecordingHandler, args),
        (rf"{PREFIX}/([^/]+)/({files})", RecordingFileHandler, args),
    ]
