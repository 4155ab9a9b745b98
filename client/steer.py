"""Join a steerable session as a steerer (docs/protocol.md §9.3), on `websockets`.

async with steer("ws://127.0.0.1:8080/v1/realtime/video", steer_token) as s:
    await s.update_prompt("A snowy street", event_id="mine-1")
    async for message, payload in s.messages():
        ...  # video.start, chunk metadata (with its payload), this steerer's acks and errors, done

A steerer gets what a watcher gets, plus the answers to its own messages (and only those). It
cannot stop the session; when the owner revokes steering the socket closes with code 4001
(`REVOKED_CLOSE_CODE`), and `messages()` ends.
"""

from __future__ import annotations

import json
import urllib.parse
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from rtvideo.core import protocol

#: the close code of a steer link the owner revoked
REVOKED_CLOSE_CODE = 4001


def steer_url(url: str, steer_token: str) -> str:
    """The steer endpoint for a session URL (`ws://host:port/v1/realtime/video`) and a token."""
    base = url.rstrip("/")
    if not base.endswith("/steer"):
        base += "/steer"
    return f"{base}?steer_token={urllib.parse.quote(steer_token, safe='')}"


class SteerClient:
    """One steer link: send interactions and pings, read what the session sends this steerer."""

    def __init__(self, url: str, steer_token: str, token: str | None = None, *, open_timeout: float = 10.0) -> None:
        self.url = steer_url(url, steer_token)
        self._token = token
        self._open_timeout = open_timeout
        self._ws: ClientConnection | None = None
        self.video_start: dict[str, Any] | None = None
        self.done: dict[str, Any] | None = None

    async def __aenter__(self) -> SteerClient:
        headers = {"Authorization": f"Bearer {self._token}"} if self._token else None
        self._ws = await connect(self.url, additional_headers=headers, max_size=2**26, open_timeout=self._open_timeout)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self._ws is not None:
            await self._ws.close()

    @property
    def revoked(self) -> bool:
        """Whether the owner revoked steering (the link closed with REVOKED_CLOSE_CODE)."""
        return self._ws is not None and self._ws.close_code == REVOKED_CLOSE_CODE

    async def interaction(self, interaction: Mapping[str, Any]) -> str:
        """Send one `session.interaction` (`{"event_id"?, "event", "transition_chunks"?}`); returns
        its event id (one is generated when absent, so that the ack can be matched)."""
        body = dict(interaction)
        if body.get("event_id") is None:
            body["event_id"] = f"steer-{uuid.uuid4().hex}"
        await self._send({"type": protocol.INTERACTION, "interaction": body})
        return str(body["event_id"])

    async def update_prompt(
        self, prompt: str, *, event_id: str | None = None, transition_chunks: int | None = None
    ) -> str:
        """A prompt update; returns its event id (its ack comes in `messages()`)."""
        interaction: dict[str, Any] = {"event_id": event_id, "event": {"prompt": prompt}}
        if transition_chunks is not None:
            interaction["transition_chunks"] = transition_chunks
        return await self.interaction(interaction)

    async def camera(
        self, camera: Mapping[str, Any], *, event_id: str | None = None, transition_chunks: int | None = None
    ) -> str:
        """A camera event (docs/protocol.md §5.1); returns its event id."""
        interaction: dict[str, Any] = {"event_id": event_id, "event": {"multi_modal_data": {"camera": dict(camera)}}}
        if transition_chunks is not None:
            interaction["transition_chunks"] = transition_chunks
        return await self.interaction(interaction)

    async def ping(self) -> None:
        await self._send({"type": protocol.PING})

    async def messages(self) -> AsyncIterator[tuple[dict[str, Any], bytes | None]]:
        """Every message with its payload (None for messages without one), until `session.done`
        or the link closes (a revoke, a drop)."""
        assert self._ws is not None, "use `async with`"
        try:
            while True:
                message = json.loads(await self._ws.recv())
                payload = None
                if message.get("type") == protocol.CHUNK_METADATA:
                    data = await self._ws.recv()
                    payload = data if isinstance(data, bytes) else data.encode()
                elif message.get("type") == protocol.VIDEO_START:
                    self.video_start = message
                yield message, payload
                if message.get("type") == protocol.DONE:
                    self.done = message
                    return
        except ConnectionClosed:
            return

    async def _send(self, message: Mapping[str, Any]) -> None:
        assert self._ws is not None, "use `async with`"
        await self._ws.send(json.dumps(message))


def steer(url: str, steer_token: str, token: str | None = None) -> SteerClient:
    """A steer link to the session whose `video.start` carried `steer_token` (`url`: the proxy's
    `/v1/realtime/video`; `token`: the proxy's bearer token, when it has one). Use `async with`."""
    return SteerClient(url, steer_token, token)
