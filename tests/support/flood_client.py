"""A flooding WebSocket client, run as its own process by tests/e2e/test_proxy_hardening.py, so that
its sending competes neither for the test process's GIL (which hosts the proxies) nor for its
memory figures.

    python -m tests.support.flood_client URL {ping,interaction} SECONDS OUT.pickle

Starts a session, sends as fast as the connection takes them for SECONDS (120 KB
`session.ping`s, or small `session.interaction`s with fresh event ids), reading whatever comes
back; then waits until every message sent has had its one answer, stops, reads to
`session.done` and the close, and pickles what it saw to OUT.
"""

from __future__ import annotations

import asyncio
import json
import pickle
import socket
import sys
import time
from typing import Any

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

PING_PAD = 120 * 1024
SEND_BUFFER = 64 * 1024
ANSWERS = {"session.pong", "session.interaction.queued", "error"}


async def flood(url: str, mode: str, seconds: float) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    data: list[bytes] = []
    answers = 0
    # A small send buffer, so that what waits in the socket when the flood ends (the proxy reads
    # a client over its rate slowly, TCP pushes back) is drained in seconds, not minutes.
    host, port = url.split("/")[2].rsplit(":", 1)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
    sock.connect((host, int(port)))
    sock.setblocking(False)
    async with connect(url, sock=sock, max_size=None, proxy=None, open_timeout=10, ping_interval=None) as conn:
        await conn.send(json.dumps({"type": "session.start", "prompt": "a flood", "seed": 11}))

        async def read() -> None:
            nonlocal answers
            try:
                async for frame in conn:
                    if isinstance(frame, bytes):
                        data.append(frame)
                        continue
                    message = json.loads(frame)
                    messages.append(message)
                    answers += message["type"] in ANSWERS
            except ConnectionClosed:
                pass

        reader = asyncio.ensure_future(read())
        while not messages:
            await asyncio.sleep(0.01)
        assert messages[0]["type"] == "video.start", messages[0]
        print("flooding", flush=True)
        ping = json.dumps({"type": "session.ping", "pad": "x" * PING_PAD})
        sent, began = 0, time.monotonic()
        try:
            while time.monotonic() - began < seconds:
                if mode == "ping":
                    await conn.send(ping)
                else:
                    await conn.send(
                        json.dumps(
                            {
                                "type": "session.interaction",
                                "interaction": {
                                    "event_id": f"f{sent}",
                                    "event": {"prompt": f"flood {sent % 3}"},
                                    "transition_chunks": 1,
                                },
                            }
                        )
                    )
                sent += 1
                await asyncio.sleep(0)  # the reader too: a client that reads what comes back
            elapsed = time.monotonic() - began
            deadline = time.monotonic() + 20
            while answers < sent and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            answered = time.monotonic() - began
            await asyncio.sleep(0.5)  # an answer beyond one per message would show up here
            await conn.send(json.dumps({"type": "session.stop"}))
        except ConnectionClosed:  # the test reports what came back
            elapsed = answered = time.monotonic() - began
        await asyncio.wait_for(reader, 30)
        return {
            "sent": sent,
            "elapsed": elapsed,
            "answered": answered,
            "messages": messages,
            "data": data,
            "close_code": conn.close_code,
        }


def main() -> None:
    url, mode, seconds, out = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
    result = asyncio.run(flood(url, mode, seconds))
    with open(out, "wb") as f:
        pickle.dump(result, f)


if __name__ == "__main__":
    main()
