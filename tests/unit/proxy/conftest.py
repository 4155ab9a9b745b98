"""Fixtures shared by the proxy's unit tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(params=["memory", "redis"])
def store_spec(request: pytest.FixtureRequest) -> Iterator[str]:
    """A store's spec for `open_store`: each test that takes it runs with the in-process store and
    with a real Redis server (the `redis_url` fixture, asked for only by the Redis run)."""
    yield "memory" if request.param == "memory" else request.getfixturevalue("redis_url")
