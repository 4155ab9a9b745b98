"""Join a live session as a guest (docs/protocol.md §9.2-9.3), on `websockets`: a read-only
watcher here, a steerer in rtvideo.client.steer (a steerer gets what a watcher gets).

async with watch("ws://127.0.0.1:8080/v1/realtime/video", watch_token) as w:
    async for message, payload in w.messages():
        ...  # video.start, an init pair, chunk metadata (with its payload), session.done

A guest link comes back by itself. When it drops, or closes before `session.done` for any
other reason than the owner's revoke (`REVOKED_CLOSE_CODE`), a refusal (a 4xxx close) or an
error the server wrote just before the close (`slow_consumer`), it is opened again with the
same token for up to `REJOIN_SECONDS`, waiting a little longer each time; a 503 (the session
is moving to another proxy) is retried after its `Retry-After`, a 403 (the session has ended)
ends it. So a proxy's restart, a takeover by another replica, or a relay between replicas that
goes costs the chunks generated meanwhile, not the link. `messages()` hides the rejoin: the
new link's `video.start` is not handed out again, nor an init pair equal to the first one, nor
a pair whose transport index was (`rejoins` counts them).
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.parse
from collections.abc import AsyncIterator
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from rtvideo.core import protocol

#: how long a dropped guest link is tried again before it is given up
REJOIN_SECONDS = 10.0
#: the first wait before a new attempt; each next one doubles, up to REJOIN_BACKOFF_MAX
REJOIN_BACKOFF = 0.1
REJOIN_BACKOFF_MAX = 1.0
#: the close code of a steer link the owner revoked
REVOKED_CLOSE_CODE = 4001
#: frames up to this size are read (a chunk's payload)
MAX_FRAME_BYTES = 2**26


def guest_url(url: str, kind: str, guest_token: str) -> str:
    """The `kind` door ("watch", "steer") for a session URL (`ws://host:port/v1/realtime/video`)."""
    base = url.rstrip("/")
    if not base.endswith(f"/{kind}"):
        base += f"/{kind}"
    return f"{base}?{kind}_token={urllib.parse.quote(guest_token, safe='')}"


def watch_url(url: str, watch_token: str) -> str:
    """The watch endpoint for a session URL and a watch token."""
    return guest_url(url, "watch", watch_token)


class GuestLink:
    """One guest link (a watch link here; SteerClient adds sending): read what the session
    sends it, across rejoins."""

    kind = "watch"

    def __init__(
        self,
        url: str,
        guest_token: str,
        token: str | None = None,
        *,
        open_timeout: float = 10.0,
        rejoin_seconds: float = REJOIN_SECONDS,
    ) -> None:
        self.url = guest_url(url, self.kind, guest_token)
        self._headers = {"Authorization": f"Bearer {token}"} if token else None
        self._open_timeout = open_timeout
        self._rejoin_seconds = rejoin_seconds
        self._ws: ClientConnection | None = None
        self._closing = False  # our own close: nothing to rejoin
        self._last_error = False  # the last message read was an error (a close right after it is the server's word)
        self._rejoining: asyncio.Future[bool] | None = None
        self._given_up = False  # a rejoin failed: the link is over
        self._init: bytes | None = None  # the first init payload handed out
        self.video_start: dict[str, Any] | None = None
        self.done: dict[str, Any] | None = None
        self.last_index = -1  # transport index of the last payload handed out
        self.rejoins = 0  # links opened again after a drop

    async def __aenter__(self) -> GuestLink:
        self._ws = await self._open(time.monotonic() + self._rejoin_seconds)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self._closing = True
        if self._rejoining is not None:
            self._rejoining.cancel()
        if self._ws is not None:
            await self._ws.close()

    @property
    def close_code(self) -> int | None:
        """The code the current link closed with (None while it is open)."""
        return None if self._ws is None else self._ws.close_code

    @property
    def revoked(self) -> bool:
        """Whether the owner revoked steering (the link closed with REVOKED_CLOSE_CODE)."""
        return self.close_code == REVOKED_CLOSE_CODE

    async def messages(self) -> AsyncIterator[tuple[dict[str, Any], bytes | None]]:
        """Every message with its payload (None for messages without one), until `session.done`
        or the link closes for good (see the module's docstring for when it is opened again)."""
        assert self._ws is not None, "use `async with`"
        while True:
            ws = self._ws
            try:
                message = json.loads(await ws.recv())
                payload = None
                if message.get("type") == protocol.CHUNK_METADATA:
                    data = await ws.recv()
                    payload = data if isinstance(data, bytes) else data.encode()
            except ConnectionClosed:
                if await self._rejoin(ws):
                    continue
                return
            self._last_error = message.get("type") == protocol.ERROR
            if not self._fresh(message, payload):
                continue
            yield message, payload
            if message.get("type") == protocol.DONE:
                self.done = message
                return

    def _fresh(self, message: dict[str, Any], payload: bytes | None) -> bool:
        """Whether to hand a message out: a rejoined link's video.start, an init pair equal to
        the first, a pair received already are not."""
        kind = message.get("type")
        if kind == protocol.VIDEO_START:
            if self.video_start is not None:
                return False
            self.video_start = message
        elif kind == protocol.CHUNK_METADATA and payload is not None:
            index = message.get("transport_chunk_index")
            if message.get("kind") == "init" or index is None:
                if self._init is not None and payload == self._init:
                    return False
                self._init = self._init or payload
            elif isinstance(index, int):
                if index <= self.last_index:
                    return False
                self.last_index = index
        return True

    def _rejoinable(self, ws: ClientConnection) -> bool:
        code = ws.close_code
        if self._closing or self._given_up or self.done is not None or (code is not None and 4000 <= code < 5000):
            return False
        return not (code == 1000 and self._last_error)  # closed right after the server said why

    async def _rejoin(self, dropped: ClientConnection) -> bool:
        """A new link in place of `dropped` (one attempt at a time, shared by readers and
        senders); False when it is not to be opened again or could not be."""
        if self._ws is not dropped:
            return True  # another caller opened it already
        if self._rejoining is None:
            if not self._rejoinable(dropped):
                return False
            self._rejoining = asyncio.ensure_future(self._reopen())
        rejoining = self._rejoining
        try:
            return await asyncio.shield(rejoining)
        finally:
            if rejoining.done() and self._rejoining is rejoining:
                self._rejoining = None

    async def _reopen(self) -> bool:
        try:
            self._ws = await self._open(time.monotonic() + self._rejoin_seconds)
        except (OSError, InvalidHandshake, asyncio.TimeoutError):
            self._given_up = True
            return False
        self.rejoins += 1
        self._last_error = False
        return True

    async def _open(self, deadline: float) -> ClientConnection:
        """A link, tried until `deadline`: a 503 after its Retry-After, a network error after
        the backoff; any other refusal (403: the session has ended) is raised at once."""
        wait = REJOIN_BACKOFF
        while True:
            try:
                return await connect(
                    self.url,
                    additional_headers=self._headers,
                    max_size=MAX_FRAME_BYTES,
                    open_timeout=self._open_timeout,
                )
            except InvalidStatus as exc:
                if exc.response.status_code != 503:
                    raise
                after = _seconds(exc.response.headers.get("Retry-After"))
                if time.monotonic() + max(wait, after) > deadline:
                    raise
                await asyncio.sleep(max(wait, after))
            except (OSError, InvalidHandshake, asyncio.TimeoutError):
                if time.monotonic() + wait > deadline:
                    raise
                await asyncio.sleep(wait)
            wait = min(wait * 2, REJOIN_BACKOFF_MAX)


def _seconds(retry_after: str | None) -> float:
    try:
        return max(0.0, float(retry_after or 0))
    except ValueError:
        return 0.0


class WatchClient(GuestLink):
    """One watch link: read what the session sends its watchers (pings aside, a watcher sends nothing)."""

    async def ping(self) -> None:
        assert self._ws is not None, "use `async with`"
        await self._ws.send(json.dumps({"type": protocol.PING}))


def watch(url: str, watch_token: str, token: str | None = None) -> WatchClient:
    """A watch link to the session whose `video.start` carried `watch_token` (`url`: the proxy's
    `/v1/realtime/video`; `token`: the proxy's bearer token, when it has one). Use `async with`."""
    return WatchClient(url, watch_token, token)
