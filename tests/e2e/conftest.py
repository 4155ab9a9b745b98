"""Fixtures shared by the end-to-end tests of this package."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from rtvideo.backend.builtin.generator import BuiltinGenerator
from tests.support.omni_triton import Engine, serve_omni
from tests.support.proxy_host import ProxyHost


@pytest.fixture(scope="package")
def omni(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ProxyHost, dict[str, Engine]]]:
    """The vllm_omni stand-in models in one tritonserver, with proxies (tests/support/omni_triton.py)."""
    yield from serve_omni(tmp_path_factory)


@pytest.fixture(scope="module")
def generator() -> Iterator[BuiltinGenerator]:
    """The built-in generator on one torch thread, as the model renders (`torch_threads` 1): the
    re-generation of a session undisturbed (tests/support/undisturbed.py)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield BuiltinGenerator(device="cpu", fps=16)
    torch.set_num_threads(threads)
