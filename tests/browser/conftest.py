"""The browser tests' proxy: one per test module, on the session's Triton, serving the paced
model (a page plays at real time, as a viewer's does)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.proxy_host import ProxyHost
from tests.support.streams import PACED_MODEL


@pytest.fixture(scope="module")
def demo_proxy(triton) -> Iterator[Any]:
    host = ProxyHost(triton.grpc_url)
    try:
        yield host.server(model=PACED_MODEL, max_sessions_per_client=2)  # every page comes from this machine
    finally:
        host.close()
