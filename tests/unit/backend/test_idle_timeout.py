"""Triton's idle timeout as the model sees it (docs/protocol.md §8): a session whose sequence had
no request for the batcher's `max_sequence_idle_microseconds` ends with `idle_timeout`; a
keep-alive ping keeps it, and is no progress for the stall clock; the heartbeat's gate."""

from __future__ import annotations

import importlib.util
import json
import sys
import threading
import time
import types
from typing import Any

import pytest

from rtvideo.backend.loading.settings import BackendSettings
from rtvideo.backend.media.encoder import FragmentedMp4Encoder
from rtvideo.backend.runtime import dispatch
from rtvideo.backend.runtime.dispatch import RequestDispatcher
from rtvideo.backend.runtime.manager import SessionManager
from rtvideo.backend.runtime.metrics import HEARTBEAT, BufferedMetrics
from rtvideo.backend.runtime.session import Limits
from rtvideo.backend.runtime.sources import GeneratorSources
from rtvideo.core import protocol
from rtvideo.core.errors import SESSION_ENDING_CODES, ErrorCode
from rtvideo.triton.model_repo import MODEL_DIR
from tests.support.recorder import Recorder
from tests.support.runtime_standins import SECRET, StandInGenerator

PING = b'{"type": "session.ping"}'
KEEPALIVE = b'{"type": "session.ping", "keepalive": true}'


def manager(behaviour: str = "ok", *, idle: float | None, stall: float = 60.0) -> SessionManager:
    settings = BackendSettings(width=64, height=64, max_sessions=2)
    return SessionManager(
        sources=GeneratorSources(StandInGenerator(behaviour), FragmentedMp4Encoder),
        capabilities=settings.capabilities("realtime_video"),
        limits=Limits(pacing_lead_chunks=1.0, max_session_seconds=60.0, stall_timeout_seconds=stall),
        max_sessions=2,
        watchdog_interval=0.05,
        idle_timeout_seconds=idle,
    )


def start(mgr: SessionManager, corrid: int = 1) -> Recorder:
    ch = Recorder()
    start = json.dumps({"type": "session.start", "prompt": "p", "fps": 16}).encode()
    mgr.on_request(corrid, start, start=True, end=False, channel=ch, secret=SECRET)
    return ch


def send(mgr: SessionManager, payload: bytes, corrid: int = 1, *, end: bool = False) -> Recorder:
    ch = Recorder()
    mgr.on_request(corrid, payload, start=False, end=end, channel=ch, secret=SECRET)
    return ch


def test_idle_timeout_is_a_session_ending_code() -> None:
    assert ErrorCode.IDLE_TIMEOUT.value == "idle_timeout" and ErrorCode.IDLE_TIMEOUT in SESSION_ENDING_CODES


def test_a_silent_sequence_ends_with_idle_timeout_then_done_and_frees_its_slot() -> None:
    mgr = manager(idle=0.4)
    began = time.monotonic()
    ch = start(mgr)
    assert ch.finished.wait(5)
    waited = time.monotonic() - began
    types_ = ch.types()
    assert types_[0] == "video.start" and types_[-2:] == ["error", "session.done"], types_
    error = ch.sent[-2][0]
    assert error["code"] == "idle_timeout" and error["request_id"] == ch.sent[0][0]["request_id"]
    assert "0.4 s" in error["message"]
    assert ch.sent[-1][2] is True and ch.sent[-1][0]["stopped"] is False
    assert 0.4 <= waited < 2.0  # the limit, plus a watch period or so
    assert mgr.active_sessions == 0
    mgr.shutdown()


@pytest.mark.parametrize("payload", [KEEPALIVE, PING])
def test_requests_keep_the_sequence_from_the_idle_timeout(payload: bytes) -> None:
    mgr = manager(idle=0.4)
    ch = start(mgr)
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        assert send(mgr, payload).types() == ["session.pong"]
        time.sleep(0.1)
    assert not ch.finished.is_set() and mgr.active_sessions == 1
    assert send(mgr, b'{"type": "session.stop"}', end=True).sent == [(None, b"", True)]
    assert ch.finished.wait(5) and ch.sent[-1][0]["stopped"] is True
    mgr.shutdown()


def test_without_a_known_limit_nothing_ends_for_idleness() -> None:
    mgr = manager(idle=None)
    ch = start(mgr)
    time.sleep(0.6)
    assert not ch.finished.is_set()
    send(mgr, b'{"type": "session.stop"}', end=True)
    assert ch.finished.wait(5)
    mgr.shutdown()


def test_a_keepalive_is_no_progress_for_the_stall_clock_but_a_client_ping_is() -> None:
    # The stand-in generator takes 1.5 s a chunk: without progress the stall clock (0.3 s) ends it.
    mgr = manager("stall", idle=None, stall=0.3)
    kept = start(mgr, 1)
    pinged = start(mgr, 2)
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline and not kept.finished.is_set():
        send(mgr, KEEPALIVE, 1)
        send(mgr, PING, 2)
        time.sleep(0.05)
    assert kept.finished.wait(5)
    assert [m["code"] for m, _, _ in kept.sent if m and m["type"] == "error"] == ["stall_timeout"]
    assert not pinged.finished.is_set(), "a client's ping is progress (docs/protocol.md §7)"
    send(mgr, b'{"type": "session.stop"}', 2, end=True)
    assert pinged.finished.wait(5)
    mgr.shutdown()


def test_the_keepalive_field_parses_only_as_true() -> None:
    assert protocol.parse_message(KEEPALIVE) == protocol.PingRequest(keepalive=True)
    assert protocol.parse_message(PING) == protocol.PingRequest(keepalive=False)
    assert protocol.parse_message(b'{"type": "session.ping", "keepalive": 1}').keepalive is False  # type: ignore[union-attr]


# --- the heartbeat ----------------------------------------------------------------------------------
def test_the_dispatcher_moves_until_one_request_is_in_hand_too_long(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dispatch, "STUCK_SECONDS", 0.2)
    release = threading.Event()
    taken = threading.Event()

    def handle(*args: Any, **kwargs: Any) -> None:
        taken.set()
        release.wait(5)

    dispatcher = RequestDispatcher(handle)
    assert dispatcher.moving()
    dispatcher.submit(1, b"", start=False, end=False, channel=Recorder())
    assert taken.wait(5)
    assert dispatcher.moving()  # in hand, not for long yet
    time.sleep(0.3)
    assert not dispatcher.moving()  # stuck: the heartbeat stops
    release.set()
    deadline = time.monotonic() + 5
    while not dispatcher.moving() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert dispatcher.moving()
    dispatcher.close()
    assert not dispatcher.moving()  # its thread is gone


def _model_module(monkeypatch: pytest.MonkeyPatch, made: list[Any] | None = None) -> Any:
    """model.py with a stand-in `triton_python_backend_utils` whose metrics record their values
    (each one the model makes is appended to `made`: what Triton would publish)."""
    made = [] if made is None else made

    class _Metric:
        def __init__(self, family: str, labels: dict) -> None:
            self.family, self.labels, self.value = family, labels, None
            self.observed: list[float] = []
            self.buckets: list | None = None

        def set(self, value: float) -> None:
            self.value = value

        def increment(self, value: float) -> None: ...

        def observe(self, value: float) -> None:
            self.observed.append(value)

    class _Family:
        GAUGE, COUNTER, HISTOGRAM = "gauge", "counter", "histogram"

        def __init__(self, name: str, doc: str, kind: str) -> None:
            self.name = name
            self.metrics: list[_Metric] = []

        def Metric(self, labels: dict, buckets: list | None = None) -> _Metric:
            self.metrics.append(_Metric(self.name, labels))
            self.metrics[-1].buckets = buckets
            made.append(self.metrics[-1])
            return self.metrics[-1]

    fake = types.ModuleType("triton_python_backend_utils")
    fake.TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1  # type: ignore[attr-defined]
    fake.MetricFamily = _Family  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", fake)
    spec = importlib.util.spec_from_file_location("rtvideo_model_heartbeat", MODEL_DIR / "1" / "model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_flush_beats_only_while_the_request_path_moves(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[Any] = []
    module = _model_module(monkeypatch, made)
    publisher = module.TritonMetricsPublisher("realtime_video", BufferedMetrics(), interval=60.0)
    try:
        before = time.time()
        publisher.flush()
        (heartbeat,) = [m for m in made if m.family == HEARTBEAT]
        assert heartbeat.value is not None and before <= heartbeat.value <= time.time()
        last = heartbeat.value
        publisher.alive = lambda: False  # a wedged request path: the beat stops, the value stays
        time.sleep(0.01)
        publisher.flush()
        assert heartbeat.value == last
        publisher.alive = lambda: True
        publisher.flush()
        assert heartbeat.value > last
    finally:
        publisher.close()


def test_the_flush_observes_each_chunk_in_the_histograms(monkeypatch: pytest.MonkeyPatch) -> None:
    """Per-chunk times and the realtime factor go to Triton histograms, one observation per chunk."""
    from rtvideo.backend.runtime import metrics

    made: list[Any] = []
    module = _model_module(monkeypatch, made)
    buffered = BufferedMetrics()
    publisher = module.TritonMetricsPublisher("realtime_video", buffered, interval=60.0)
    try:
        buffered.observe_chunk(0.5, 0.25, 9, 1000, 16)  # 9/16 s of video in 0.75 s: 0.75
        buffered.observe_chunk(0.1, 0.0, 16, 1000, 16)  # 1 s in 0.1 s: 10
        publisher.flush()
        histograms = {m.family: m for m in made if m.buckets is not None}
        factor = histograms[metrics.REALTIME_FACTOR]
        assert factor.observed == pytest.approx([0.75, 10.0])
        assert factor.buckets == list(metrics.FACTOR_BUCKETS)
        assert histograms[metrics.GENERATE_DURATION].observed == [0.5, 0.1]
        assert histograms[metrics.ENCODE_DURATION].observed == [0.25, 0.0]
        publisher.flush()  # drained: nothing twice
        assert len(factor.observed) == 2
    finally:
        publisher.close()


def test_the_idle_limit_is_read_from_the_model_config(monkeypatch: pytest.MonkeyPatch) -> None:
    module = _model_module(monkeypatch)
    read = module.sequence_idle_seconds
    assert read({"sequence_batching": {"max_sequence_idle_microseconds": "120000000"}}) == 120.0
    assert read({"sequence_batching": {"max_sequence_idle_microseconds": 6000000}}) == 6.0
    assert read({"sequence_batching": {}}) is None and read({}) is None
    assert read({"sequence_batching": {"max_sequence_idle_microseconds": "0"}}) is None
    shipped = (MODEL_DIR / "config.pbtxt").read_text()
    assert "max_sequence_idle_microseconds: 120000000" in shipped
