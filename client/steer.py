"""Join a steerable session as a steerer (docs/protocol.md §9.3), on `websockets`.

async with steer("ws://127.0.0.1:8080/v1/realtime/video", steer_token) as s:
    await s.update_prompt("A snowy street", event_id="mine-1")
    async for message, payload in s.messages():
        ...  # video.start, chunk metadata (with its payload), this steerer's acks and errors, done

A steerer gets what a watcher gets, plus the answers to its own messages (and only those). It
cannot stop the session; when the owner revokes steering the socket closes with code 4001
(`REVOKED_CLOSE_CODE`), and `messages()` ends. Its link comes back by itself as a watch link
does (rtvideo.client.watch): a send that meets a dropped link waits for the new one. An
interaction whose ack had not come when the link dropped may be sent again with the same
event id: the session acks a retry without applying it twice.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import Any

from websockets.exceptions import ConnectionClosed

from rtvideo.client.watch import REVOKED_CLOSE_CODE, GuestLink, guest_url
from rtvideo.core import protocol

__all__ = ["REVOKED_CLOSE_CODE", "SteerClient", "steer", "steer_url"]


def steer_url(url: str, steer_token: str) -> str:
    """The steer endpoint for a session URL (`ws://host:port/v1/realtime/video`) and a token."""
    return guest_url(url, "steer", steer_token)


class SteerClient(GuestLink):
    """One steer link: send interactions and pings, read what the session sends this steerer."""

    kind = "steer"

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

    async def _send(self, message: Mapping[str, Any]) -> None:
        """Sent on the live link; one that dropped is opened again first (ConnectionClosed when
        it is not to be, or could not be)."""
        assert self._ws is not None, "use `async with`"
        text = json.dumps(message)
        while True:
            ws = self._ws
            try:
                await ws.send(text)
                return
            except ConnectionClosed:
                if not await self._rejoin(ws):
                    raise


def steer(url: str, steer_token: str, token: str | None = None) -> SteerClient:
    """A steer link to the session whose `video.start` carried `steer_token` (`url`: the proxy's
    `/v1/realtime/video`; `token`: the proxy's bearer token, when it has one). Use `async with`."""
    return SteerClient(url, steer_token, token)
