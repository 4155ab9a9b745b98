"""Who may drain an endpoint (rtvideo.proxy.moves.http): with `--token` only its holder; without
one only a request from the proxy's own machine. A request that reaches the proxy on another of
the machine's addresses (not loopback) is refused with 403 before anything is drained."""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import pytest
import tornado.httpserver
import tornado.netutil
import tornado.web

from rtvideo.proxy.moves.http import PATH, DrainHandler
from tests.support.http_calls import fetch


def outward_address() -> str | None:
    """One of this machine's own non-loopback addresses (None when it has none)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: nothing is sent by a UDP connect
        except OSError:
            return None
        address = probe.getsockname()[0]
    return None if address.startswith("127.") else address


def post(url: str, token: str | None = None) -> tuple[int, dict[str, Any]]:
    status, body, headers = fetch(url, token=token, method="POST", headers={"Host": "localhost"})
    return status, json.loads(body) if headers.get("Content-Type") == "application/json" else {}


@pytest.mark.parametrize("token", [None, "drain-token"])
def test_only_this_machine_or_the_token_holder_drains(token: str | None) -> None:
    address = outward_address()
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address to call from")
    drained: list[tuple[str, bool]] = []

    def drain(endpoint: str, on: bool) -> list[object]:
        drained.append((endpoint, on))
        return []

    async def body() -> list[tuple[int, dict[str, Any]]]:
        app = tornado.web.Application([(PATH, DrainHandler, {"drain": drain, "sessions": lambda: [], "token": token})])
        sockets = tornado.netutil.bind_sockets(0, "0.0.0.0")
        server = tornado.httpserver.HTTPServer(app)
        server.add_sockets(sockets)
        port = sockets[0].getsockname()[1]
        try:
            calls = [
                (f"http://{address}:{port}/v1/endpoints/a:1/drain", None),  # another address, no token
                (f"http://127.0.0.1:{port}/v1/endpoints/b:1/drain", None),  # this machine, no token
                (f"http://{address}:{port}/v1/endpoints/c:1/drain", token),  # another address, the token
            ]
            return [await asyncio.to_thread(post, url, given) for url, given in calls]
        finally:
            server.stop()

    (far, near, held) = asyncio.run(body())
    if token is None:
        assert far == (403, {"error": "draining needs --token, or a request from this machine"})
        assert near[0] == 200 and held[0] == 403
        assert drained == [("b:1", True)]
    else:
        assert far[0] == 401 and near[0] == 401  # the token, from anywhere
        assert held == (200, {"endpoint": "c:1", "draining": True, "sessions": 0, "moving": 0})
        assert drained == [("c:1", True)]
