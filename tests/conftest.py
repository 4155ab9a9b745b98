"""One real tritonserver for the whole test session (under parallel workers, `pytest -n N`: one
per worker, each worker being a test session of its own), serving models derived from the real one,
real proxies in front of it (`proxies`, one host per module), two more tritonservers for the
tests of many endpoints (`pair`, `host`), a real redis-server (`redis_url`), and the markers
that say what a test needs (registered in pyproject.toml)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rtvideo.triton.model_repo import derive_model
from tests.support.proxy_host import ProxyHost
from tests.support.redis_server import serve_redis
from tests.support.streams import (
    FAST_MODEL,
    FAST_MODEL_NAMES,
    IDLE_MODEL,
    IDLE_MODEL_SECONDS,
    PACED_MODEL,
    SLOTS_MODEL,
    SLOTS_MODEL_OPTIONS,
    SLOTS_MODEL_SLOTS,
)
from tests.support.triton_pair import Host, Pair


def worker_path(path: Path) -> Path:
    """`path` for this test session: under pytest-xdist each worker (`gw0`, `gw1`, ...) is a session
    of its own with its own servers, so a file named from outside (an environment variable) gets the
    worker's name in it (`triton-gw1.log`) instead of being written by several at once."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    return path if not worker else path.with_name(f"{path.stem}-{worker}{path.suffix}")


@pytest.fixture(scope="session")
def triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from rtvideo.triton.access import KEY_ENV, generate_key
    from rtvideo.triton.command import TritonConfig
    from rtvideo.triton.server import TritonServer, free_port

    repo = tmp_path_factory.mktemp("model_repository")
    # The fast model renders in the model's own process (render_workers 0); the paced one as
    # shipped, in render worker processes: both paths run every end-to-end test that uses them.
    derive_model(
        repo,
        FAST_MODEL,
        {
            "pacing_lead_chunks": "off",
            "max_sessions": "8",
            # measured and reported, never refusing: tests load it past real time on purpose (the
            # realtime alert); admission by capacity has a model of its own (test_realtime_admission)
            "realtime_capacity_fps": "off",
            "render_workers": "0",
            "served_model_names": ",".join(FAST_MODEL_NAMES),
        },
    )
    derive_model(repo, PACED_MODEL, {"max_sessions": "2"})
    # two small models that tests/e2e/test_late_probe.py and test_sequence_slots.py fill and read
    # the slot gauges of, each to itself: served here rather than by a tritonserver of their own
    batcher = {"max_candidate_sequences": SLOTS_MODEL_SLOTS}
    derive_model(repo, SLOTS_MODEL, SLOTS_MODEL_OPTIONS, sequence_batching=batcher)
    idle = {**batcher, "max_sequence_idle_microseconds": int(IDLE_MODEL_SECONDS * 1e6)}
    derive_model(repo, IDLE_MODEL, SLOTS_MODEL_OPTIONS, sequence_batching=idle)
    log = worker_path(Path(os.environ.get("RTVIDEO_TEST_TRITON_LOG", str(repo / "triton.log"))))
    # Keyed as `rtvideo serve` keys its own Triton; the key in the environment for the whole test
    # session, where TritonStreamSession, the proxies here and `rtvideo serve` subprocesses read it.
    key = generate_key()
    server = TritonServer(
        TritonConfig(
            model_repository=repo, grpc_port=free_port(), http_port=free_port(), metrics_port=free_port(), key=key
        ),
        stdout=log,
    )
    server.start(timeout=300)
    previous = os.environ.get(KEY_ENV)
    os.environ[KEY_ENV] = key
    try:
        yield server
    finally:
        server.stop()
        if previous is None:
            os.environ.pop(KEY_ENV, None)
        else:
            os.environ[KEY_ENV] = previous


@pytest.fixture(autouse=True)
def _session_triton_outlives_each_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that used the session's Triton fails when that Triton died during it, saying how
    (its exit code and log tail), and the next test gets it started again on the same ports and
    key. Without this a dead session Triton fails every later test of the worker, far from the
    cause. Triton 2.51 (the wheel's; nvidia-pytriton 0.7.0 is the newest) can abort inside gRPC
    when a stream's cancellation races its last response (triton-inference-server/server#7368,
    fixed by #7840 in 24.12): seen under parallel workers, never serially (docs/testing.md)."""
    if "triton" not in request.fixturenames:
        yield
        return
    server = request.getfixturevalue("triton")
    yield
    if server.is_alive():
        return
    code, tail = server.exit_code, server.log.tail(3000)
    server.stop()
    server.start(timeout=300)
    pytest.fail(f"the session's tritonserver exited (code {code}) during this test; restarted. Log tail:\n{tail}")


@pytest.fixture(scope="module")
def proxies(triton) -> Iterator[ProxyHost]:
    """Real proxies in front of the session's Triton, one per distinct setting, for one module."""
    host = ProxyHost(triton.grpc_url)
    try:
        yield host
    finally:
        host.close()


#: folders whose every test needs a running tritonserver (or starts `rtvideo serve`)
_TRITON_FOLDERS = ("e2e", "browser")


#: session fixtures that start servers of their own (`omni`: a tritonserver of the vLLM-Omni
#: stand-ins; `pair`: two tritonservers): the files that use any of them run on one worker, which
#: starts them once, instead of on every worker that ran one of those files
_SHARED_SERVERS = ("omni", "pair")
_SHARED_GROUP = "shared-servers"
#: the order in which parallel workers take files: the group above, then the folders whose tests
#: start servers and wait in real time, then the unit tests, short ones that fill the last gaps
_FOLDER_ORDER = ("deploy", "browser", "e2e")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups (it suffixes the node ids)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test by what it needs: `triton` (the session's server, or one it starts),
    `browser` (headless Chromium), `redis` (the session's redis-server). `pytest -m "not triton"`
    then runs the fast part alone.

    Under parallel workers (`--dist loadgroup`, scripts/test.sh) each test also gets its group, the
    unit a worker takes whole: its file, so that a module's fixtures stay in one process, or
    `_SHARED_GROUP`; and the groups are ordered longest first, so that no worker is left with a
    long file at the end while the other idles."""
    for item in items:
        parts = Path(str(item.fspath)).parts
        fixtures = getattr(item, "fixturenames", ())
        if "browser" in parts:
            item.add_marker(pytest.mark.browser)
        if any(folder in parts for folder in _TRITON_FOLDERS) or "triton" in fixtures:
            item.add_marker(pytest.mark.triton)
        if "redis_url" in fixtures:
            item.add_marker(pytest.mark.redis)
    if not os.environ.get("PYTEST_XDIST_WORKER"):  # a serial run keeps the collection's order
        return
    shared = {str(i.fspath) for i in items if set(_SHARED_SERVERS) & set(getattr(i, "fixturenames", ()))}
    groups = {item: _SHARED_GROUP if str(item.fspath) in shared else str(item.fspath) for item in items}
    for item, group in groups.items():
        item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=lambda item: _rank(item, groups[item]))


def _rank(item: pytest.Item, group: str) -> int:
    if group == _SHARED_GROUP:
        return 0
    parts = Path(str(item.fspath)).parts
    return next((1 + n for n, folder in enumerate(_FOLDER_ORDER) if folder in parts), 1 + len(_FOLDER_ORDER))


@pytest.fixture(scope="session")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    """Two real tritonservers (tests/support/triton_pair.py), started once for the modules that use them."""
    p = Pair(tmp_path_factory.mktemp("pair"))
    try:
        t0 = time.monotonic()
        p.start()
        print(f"two tritonservers ready in {time.monotonic() - t0:.1f} s")
        yield p
    finally:
        p.stop()


@pytest.fixture
def host() -> Iterator[Host]:
    h = Host()
    try:
        yield h
    finally:
        h.close()


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`redis://127.0.0.1:PORT/0` of a redis-server this test session starts and ends
    (tests/support/redis_server.py): no persistence, its files in a temporary directory. One
    server for the whole session: each test keeps to keys of its own (or flushes them). Without
    the binary a test that asks for it is skipped, or fails under CI (`CI` set)."""
    with serve_redis(tmp_path_factory.mktemp("redis")) as server:
        yield server.url
