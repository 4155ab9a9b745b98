"""The Redis that the session store's tests run against (issue 39; the store's own tests go here):
the `redis_url` fixture's redis-server round-trips a value through `redis.asyncio`, keeps
nothing on disk and listens on loopback only; the server ends with its fixture, also when the
body fails; a machine without the binary skips, CI fails."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from tests.support import redis_server
from tests.support.redis_server import answers_ping, serve_redis


def test_the_session_redis_round_trips_and_keeps_nothing_on_disk(redis_url: str) -> None:
    async def body() -> None:
        client = aioredis.from_url(redis_url)
        try:
            assert await client.ping() is True
            await client.set("rtvideo:test:fixture", b"\x00session\xff", ex=60)
            assert await client.get("rtvideo:test:fixture") == b"\x00session\xff"
            assert await client.delete("rtvideo:test:fixture") == 1
            assert await client.config_get("save") == {"save": ""}
            assert await client.config_get("appendonly") == {"appendonly": "no"}
            assert await client.config_get("bind") == {"bind": "127.0.0.1"}
        finally:
            await client.aclose()

    assert redis_url.startswith("redis://127.0.0.1:") and redis_url.endswith("/0")
    asyncio.run(asyncio.wait_for(body(), 20))


@pytest.mark.redis
def test_the_server_ends_with_its_fixture_even_when_the_body_fails(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="the body failed"), serve_redis(tmp_path) as server:
        proc, port = server.proc, server.port
        assert proc is not None and answers_ping(port)
        raise RuntimeError("the body failed")
    assert proc.poll() is not None and not answers_ping(port)


def test_without_the_binary_a_developer_skips_and_ci_fails(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(redis_server.shutil, "which", lambda name: None)
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="redis-server is not installed"), serve_redis(tmp_path):
        pass
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI must run the Redis tests"), serve_redis(tmp_path):
        pass
