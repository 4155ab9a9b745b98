"""A session store (rtvideo.proxy.store) for one test body: opened from its spec ("memory" or a
Redis URL), handed to the body on a fresh loop, closed whatever the body did."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from rtvideo.proxy.store import open_store
from rtvideo.proxy.store.base import SessionStore

T = TypeVar("T")
BODY_SECONDS = 30.0


def with_store(spec: str, body: Callable[[SessionStore], Awaitable[T]]) -> T:
    async def main() -> T:
        store = open_store(spec)
        try:
            return await body(store)
        finally:
            await store.close()

    return asyncio.run(asyncio.wait_for(main(), BODY_SECONDS))
