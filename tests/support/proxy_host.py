"""Real proxies for the tests: a background event loop hosting `ProxyServer`s (one per distinct
setting) against a given Triton, and the runner of a test body on its own client loop."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable
from typing import Any, TypeVar

from rtvideo.proxy.app import ProxyServer
from rtvideo.proxy.settings import ProxySettings
from rtvideo.triton.access import key_from_env
from tests.support.streams import FAST_MODEL, wait_for_metric

T = TypeVar("T")


class ProxyHost:
    """A thread running one asyncio loop that hosts proxy servers, one per distinct setting."""

    def __init__(self, triton_url: str) -> None:
        self.triton_url = triton_url
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="proxy-loop", daemon=True)
        self._thread.start()
        self._servers: dict[tuple, ProxyServer] = {}

    def call(self, coro: Awaitable[T], timeout: float = 30.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)  # type: ignore[arg-type]

    def server(self, **overrides: Any) -> ProxyServer:
        values = {
            "port": 0,
            "triton_url": self.triton_url,
            "model": FAST_MODEL,
            "triton_key": key_from_env(),
            **overrides,
        }
        key = tuple(sorted(values.items()))
        if key not in self._servers:

            async def start() -> ProxyServer:
                server = ProxyServer(ProxySettings(**values))
                await server.start()
                return server

            self._servers[key] = self.call(start())
        return self._servers[key]

    def url(self, **overrides: Any) -> str:
        return self.server(**overrides).url

    def wait_sessions_closed(self, timeout: float = 60.0) -> None:
        """Until no proxy here holds a session: an earlier test's session closes a moment after
        its `session.done` went out, and counts against the client's share of slots till then."""

        async def held() -> int:
            return sum(len(server.context.sessions) for server in self._servers.values())

        deadline = time.monotonic() + timeout
        while self.call(held()) and time.monotonic() < deadline:
            time.sleep(0.05)

    def close(self) -> None:
        for server in self._servers.values():  # a session still ending may take SHUTDOWN_SECONDS and more
            self.call(server.stop(), timeout=90)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


def run(coro: Awaitable[T], timeout: float = 120.0) -> T:
    """Run one test body on a fresh client loop (the proxies run on their own loop)."""
    return asyncio.run(asyncio.wait_for(coro, timeout))  # type: ignore[arg-type]


def wait_idle(triton: Any, model: str = FAST_MODEL, timeout: float = 30.0) -> None:
    """Wait until the model has no live session (earlier tests' sessions end within a chunk)."""
    wait_for_metric(triton, "rtvideo_active_sessions", model, 0, timeout)
