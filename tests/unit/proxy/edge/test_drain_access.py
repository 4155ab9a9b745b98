"""Who may drain an endpoint (rtvideo.proxy.edge.drain): the operator alone, by the
`--admin-token` bearer, from anywhere; never a client's token, never "any caller on this
machine", never a cross-origin page or a body a page can send without a preflight."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import tornado.httpserver
import tornado.netutil
import tornado.web

from rtvideo.proxy.edge.drain import PATH, DrainHandler
from tests.support.http_calls import fetch

ADMIN = "the-operators-credential"
CLIENT = "a-clients-token"


def post(url: str, token: str | None = None, headers: dict[str, str] | None = None, data: bytes | None = None) -> Any:
    status, body, got = fetch(
        url, token=token, method="POST", headers={"Host": "localhost", **(headers or {})}, data=data
    )
    return status, json.loads(body) if got.get("Content-Type", "").startswith("application/json") else {}


def calls(admin: str | None, tried: list[tuple[str, dict[str, Any]]]) -> tuple[list[Any], list[str]]:
    drained: list[str] = []

    def drain(endpoint: str, on: bool) -> list[object]:
        drained.append(endpoint)
        return []

    async def body() -> list[Any]:
        args = {"drain": drain, "sessions": lambda: [], "admin_token": admin, "allowed_origins": ()}
        app = tornado.web.Application([(PATH, DrainHandler, args)])
        sockets = tornado.netutil.bind_sockets(0, "127.0.0.1")
        server = tornado.httpserver.HTTPServer(app)
        server.add_sockets(sockets)
        port = sockets[0].getsockname()[1]
        try:
            return [
                await asyncio.to_thread(post, f"http://127.0.0.1:{port}/v1/endpoints/{name}", **kw)
                for name, kw in tried
            ]
        finally:
            server.stop()

    return asyncio.run(body()), drained


def test_without_an_operator_credential_configured_nobody_drains() -> None:
    (bare, client), drained = calls(None, [("a:1/drain", {}), ("b:1/drain", {"token": CLIENT})])
    assert bare[0] == 403 and "--admin-token" in bare[1]["error"]
    assert client[0] == 403 and drained == []


@pytest.mark.parametrize(
    ("how", "expected"),
    [
        ({}, 401),  # loopback, no credential
        ({"token": CLIENT}, 401),  # a client's token
        ({"token": ADMIN, "headers": {"Origin": "https://evil.example"}}, 403),  # a foreign page
        ({"token": ADMIN, "headers": {"Content-Type": "text/plain"}, "data": b"x"}, 415),  # a simple body
        ({"token": ADMIN, "headers": {"Origin": "http://localhost"}}, 200),  # this server's own page
        ({"token": ADMIN}, 200),
    ],
)
def test_the_operator_alone_drains(how: dict[str, Any], expected: int) -> None:
    (answer,), drained = calls(ADMIN, [("a:1/drain", how)])
    assert answer[0] == expected, answer
    assert drained == (["a:1"] if expected == 200 else [])


def test_the_operators_credential_in_a_query_string_is_not_taken() -> None:
    (answer,), drained = calls(ADMIN, [(f"a:1/drain?token={ADMIN}", {})])
    assert answer[0] == 401 and drained == []
