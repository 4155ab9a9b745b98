"""Shared by the benchmark scripts: percentiles and a tritonserver with derived models."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

from rtvideo.triton.access import KEY_ENV, generate_key
from rtvideo.triton.command import TritonConfig
from rtvideo.triton.model_repo import derive_model
from rtvideo.triton.server import TritonServer, free_port

#: the two load shapes every benchmark compares: shipped pacing, and as fast as the CPU goes
PACED_PARAMS = {"max_sessions": "8"}
UNPACED_PARAMS = {"max_sessions": "8", "pacing_lead_chunks": "off"}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else float("nan")


@contextlib.contextmanager
def triton_key() -> Iterator[str]:
    """A new Triton access key, in `$RTVIDEO_TRITON_KEY` while the block runs: the benchmarks'
    direct clients (TritonStreamSession) and their `rtvideo serve --triton-url` proxies read it."""
    key, previous = generate_key(), os.environ.get(KEY_ENV)
    os.environ[KEY_ENV] = key
    try:
        yield key
    finally:
        if previous is None:
            os.environ.pop(KEY_ENV, None)
        else:
            os.environ[KEY_ENV] = previous


@contextlib.contextmanager
def bench_triton(models: Mapping[str, Mapping[str, str]]) -> Iterator[TritonServer]:
    """A tritonserver on free loopback ports serving `name -> parameter overrides` models, keyed as
    `rtvideo serve` keys its own (the key in the environment, see `triton_key`)."""
    with tempfile.TemporaryDirectory() as tmp, triton_key() as key:
        repo = Path(tmp)
        for name, params in models.items():
            derive_model(repo, name, params)
        config = TritonConfig(repo, grpc_port=free_port(), http_port=free_port(), metrics_port=free_port(), key=key)
        with TritonServer(config, stdout=repo / "triton.log") as server:
            yield server


def parent_pids() -> dict[int, int]:
    """pid → parent pid of every process (Linux /proc)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                parents[int(entry)] = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
    return parents


def family(root: int) -> list[int]:
    """`root` and every process below it."""
    parents = parent_pids()
    found, frontier = {root}, {root}
    while frontier:
        frontier = {c for c, p in parents.items() if p in frontier} - found
        found |= frontier
    return sorted(found)
