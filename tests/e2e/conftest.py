"""Fixtures shared by the end-to-end tests of this package."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.omni_triton import Engine, serve_omni
from tests.support.proxy_host import ProxyHost


@pytest.fixture(scope="package")
def omni(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ProxyHost, dict[str, Engine]]]:
    """The vllm_omni stand-in models in one tritonserver, with proxies (tests/support/omni_triton.py)."""
    yield from serve_omni(tmp_path_factory)
