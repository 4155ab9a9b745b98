"""The proxy against hostile clients: forged Host names, cross-site pages, one client holding
every slot, bad bytes, floods. Real proxies, the session's real Triton, real WebSocket clients."""

from __future__ import annotations

import asyncio
import http.client

from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from rtvideo.proxy.access import host_allowed, origin_allowed
from tests.test_proxy import proxies, run, status_of  # noqa: F401 - `proxies` is a fixture


def http_status(port: int, path: str, host: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path, headers={"Host": host})
        return conn.getresponse().status
    finally:
        conn.close()


def test_host_allow_list_on_loopback(proxies) -> None:
    """DNS rebinding: a page on attacker.example that resolves to 127.0.0.1 names its own Host."""
    server = proxies.server()
    for path in ("/", "/healthz", "/metrics", "/v1/realtime/video"):
        assert http_status(server.port, path, f"attacker.example:{server.port}") == 403
        assert http_status(server.port, path, f"localhost:{server.port}") != 403
        assert http_status(server.port, path, f"127.0.0.1:{server.port}") != 403
    listed = proxies.server(allowed_hosts=("video.internal",))
    assert http_status(listed.port, "/", "video.internal") == 200
    assert http_status(listed.port, "/", "other.internal") == 403


def test_host_rule() -> None:
    assert host_allowed("localhost:8080", "127.0.0.1", ())
    assert host_allowed("[::1]:8080", "::1", ())
    assert not host_allowed("evil.example", "127.0.0.1", ())
    assert host_allowed("pod-7.svc", "0.0.0.0", ())  # bound to every address: any name unless listed
    assert not host_allowed("pod-7.svc", "0.0.0.0", ("video.example",))
    assert host_allowed("anything", "127.0.0.1", ("*",))


def test_origin_rule_is_explicit() -> None:
    assert origin_allowed("https://video.example", [], "video.example")  # the page we served
    assert origin_allowed("http://video.example:8080", [], "video.example:8080")
    assert not origin_allowed("http://video.example:9999", [], "video.example:8080")  # another port
    assert not origin_allowed("https://evil.example", [], "video.example")
    assert origin_allowed("http://127.0.0.1:5173", [], "video.example")  # local development page


def test_one_client_cannot_hold_every_slot(proxies) -> None:
    url = proxies.url(max_sessions_per_client=2, max_connections=10)

    async def body() -> None:
        async with connect(url), connect(url):
            try:
                async with connect(url):
                    raise AssertionError("a third session from the same address was accepted")
            except InvalidStatus as exc:
                assert exc.response.status_code == 429
        for _ in range(100):  # slots free when the proxy sees the closes
            try:
                async with connect(url):
                    return
            except InvalidStatus:
                await asyncio.sleep(0.05)
        raise AssertionError("the client's slots were not freed")

    run(body(), 30)


