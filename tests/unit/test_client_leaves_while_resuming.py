"""Leaving `async with RealtimeVideoClient(...)` while it resumes a dropped connection ends the
resume: `__aexit__` returns, and a connection the resume opened is closed, not read on.

Against a scripted `websockets` server: the first connection starts a resumable session, hands
out one chunk pair and drops its TCP connection (no close frame). A `session.resume` is
answered only once the test is leaving, with `resumed: true` and then chunks without end, so a
client that finished the resume after `__aexit__` began would read on forever. Where the test
leaves is fixed by the server, not by timing: while the client awaits the answer to its resume,
and while it waits to retry after a refusal (the server "has not seen the old connection go")."""

from __future__ import annotations

import asyncio
import json

import pytest
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from rtvideo.client.session import RealtimeVideoClient
from rtvideo.core import protocol
from rtvideo.core.resume import RESUME
from tests.support.resume_client import within

#: a bound only a hang reaches
HANG = 10.0


class _ScriptedServer:
    """The server's side: when a resume was asked (or refused), and every connection a resume
    opened. `leaving` is the test's word that it leaves the `async with` now."""

    def __init__(self, refuse_first_resume: bool) -> None:
        self.refuse_first_resume = refuse_first_resume
        self.resume_asked = asyncio.Event()  # a resume waits for its answer
        self.refused = asyncio.Event()  # a resume was refused: the client waits to retry
        self.leaving = asyncio.Event()
        self.resume_connections: list[ServerConnection] = []

    async def handler(self, ws: ServerConnection) -> None:
        first = json.loads(await ws.recv())
        if first["type"] == protocol.START:
            start = {"type": protocol.VIDEO_START, "request_id": "r", "resume_token": "token-1", "config": {"fps": 16}}
            await ws.send(json.dumps(start))
            await self._pair(ws, 0)
            ws.transport.abort()  # a dropped connection, not a close
            return
        assert first["type"] == RESUME and first["resume_token"] == "token-1"
        self.resume_connections.append(ws)
        if self.refuse_first_resume and not self.refused.is_set():
            refusal = {"type": protocol.ERROR, "code": "invalid_request", "message": "the session is attached"}
            await ws.send(json.dumps(refusal))
            await ws.wait_closed()  # the client closes a refused connection, then waits to retry
            self.refused.set()
            return
        self.resume_asked.set()
        await self.leaving.wait()
        resumed = {"type": protocol.VIDEO_START, "request_id": "r", "resumed": True, "resume_token": "token-2"}
        try:
            await ws.send(json.dumps(resumed))
            index = 1
            while True:  # the stream goes on until the client goes
                await self._pair(ws, index)
                index += 1
                await asyncio.sleep(0.02)
        except ConnectionClosed:
            pass

    @staticmethod
    async def _pair(ws: ServerConnection, index: int) -> None:
        metadata = {"type": protocol.CHUNK_METADATA, "kind": "media", "transport_chunk_index": index, "num_frames": 4}
        await ws.send(json.dumps(metadata))
        await ws.send(b"\0" * 64)


@pytest.mark.parametrize("refuse_first_resume", [False, True], ids=["awaiting-the-answer", "waiting-to-retry"])
def test_leaving_while_a_resume_is_under_way_ends_it(refuse_first_resume: bool) -> None:
    server = _ScriptedServer(refuse_first_resume)

    async def main() -> None:
        async with serve(server.handler, "127.0.0.1", 0) as listening:
            port = listening.sockets[0].getsockname()[1]
            client = RealtimeVideoClient(f"ws://127.0.0.1:{port}", resume_backoff=0.05)
            # `async with`, spelled out so that the wait in `__aexit__` alone is bounded
            await within(client.__aenter__(), HANG)
            await within(client.start("x", resumable=True), HANG)
            await within((server.refused if refuse_first_resume else server.resume_asked).wait(), HANG)
            assert client.reconnecting  # the server answers no resume before `leaving`
            server.leaving.set()
            try:
                await within(client.__aexit__(None, None, None), HANG)
            except asyncio.TimeoutError:
                pytest.fail("__aexit__ waited on a resume that went on after it began")
            assert server.resume_connections
            for ws in server.resume_connections:  # none left open, none streaming to nobody
                await within(ws.wait_closed(), HANG)
            assert client.failure is not None  # the session is over for the caller

    asyncio.run(within(main(), 4 * HANG))
