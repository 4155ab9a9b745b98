"""`GET /v1/broadcasts/{id}/{index.m3u8|init.mp4|N.m4s}`: a folder store's broadcasts, served by
the proxy (docs/protocol.md "Broadcasts"). An fsspec store is not served here: a CDN serves it.

The id in the path is the capability (128 random bits): no `--token` is asked, as an HLS player
or a CDN pulling from the proxy could not send one. Anything but a well-formed id and one of the
served names is 404, as an unknown id is. Cache headers for a CDN in front (docs/operations.md):
the playlist changes with every chunk (`no-cache`: revalidated each time), a segment and the init
segment never change under their name (`immutable`). Files are read off the event loop. The id
never reaches the access log (rtvideo.redaction.redact_path masks it there).
"""

from __future__ import annotations

import asyncio
from typing import Any

import tornado.web

from rtvideo.proxy.broadcasts import playlist
from rtvideo.proxy.broadcasts.service import PREFIX, Broadcasts

#: `Cache-Control` of the playlist and of the segments
PLAYLIST_CACHE = "no-cache"
SEGMENT_CACHE = "public, max-age=31536000, immutable"


class BroadcastFileHandler(tornado.web.RequestHandler):
    def initialize(self, broadcasts: Broadcasts) -> None:
        self.broadcasts = broadcasts

    def set_default_headers(self) -> None:
        self.set_header("Access-Control-Allow-Origin", "*")  # any player's page may read a broadcast

    async def head(self, bid: str, name: str) -> None:
        await self.get(bid, name, body=False)

    async def get(self, bid: str, name: str, body: bool = True) -> None:
        found = await asyncio.to_thread(self.broadcasts.open, bid, name)
        if found is None:
            self.set_status(404)
            self.set_header("Cache-Control", "no-store")
            self.finish({"error": "no such broadcast, or it has ended and was removed"})
            return
        f, size = found
        try:
            if name == playlist.PLAYLIST:
                self.set_header("Content-Type", playlist.PLAYLIST_TYPE)
                self.set_header("Cache-Control", PLAYLIST_CACHE)
            else:
                self.set_header("Content-Type", "video/mp4" if name == playlist.INIT else "video/iso.segment")
                self.set_header("Cache-Control", SEGMENT_CACHE)
            data = await asyncio.to_thread(f.read) if body else b""
        finally:
            f.close()
        self.set_header("Content-Length", str(len(data) if body else size))
        self.finish(data)


def routes(broadcasts: Broadcasts | None) -> list[tuple[str, type, dict[str, Any]]]:
    """The handler, when broadcasts are stored in a folder the proxy can serve."""
    if broadcasts is None or broadcasts.folder is None:
        return []
    return [(rf"{PREFIX}/([^/]+)/([^/]+)", BroadcastFileHandler, {"broadcasts": broadcasts})]
