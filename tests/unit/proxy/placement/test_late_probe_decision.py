"""Busy, late or down when a probe gets no answer in time (docs/operations.md "Busy, late and
down"; issue 46 item 6): busy only when the model says every sequence slot is held; a late probe
with free slots is late (admitting, ready, no failure) while the heartbeat moves; a frozen
heartbeat is a failure. The metrics text is what the real model emits on Triton's /metrics
(captured from tests/e2e/test_late_probe.py's Triton, one model instance)."""

from __future__ import annotations

import asyncio
import time

import pytest

from rtvideo.backend.runtime import metrics as model_metrics
from rtvideo.backend.runtime.sequence_slots import MAX_TRACKED, SequenceSlots
from rtvideo.proxy.observability.metrics import ProxyMetrics
from rtvideo.proxy.placement.bridge import ProbeTimeout
from rtvideo.proxy.placement.heartbeat import HELD_METRIC, SLOTS_METRIC, Pulse, slots_full_in
from rtvideo.proxy.placement.pool import EndpointProbes
from rtvideo.proxy.placement.supervisor import BackendState, Supervisor

MODEL = "realtime_video"
#: an excerpt of a real Triton's /metrics with one live session (tests/e2e/test_late_probe.py prints it):
#: Triton's own series, then the model's, one model instance
REAL_METRICS = """\
# HELP nv_inference_request_success Number of successful inference requests, all batch sizes
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="realtime_video",version="1"} 2
# HELP nv_inference_pending_request_count Instantaneous number of pending requests awaiting execution per-model.
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{model="realtime_video",version="1"} 0
# HELP rtvideo_active_sessions Sessions streaming now
# TYPE rtvideo_active_sessions gauge
rtvideo_active_sessions{instance="realtime_video_0_0",model="realtime_video"} 1
# HELP rtvideo_paused_sessions Sessions paused now (a proxy's detached session; they hold their slot)
# TYPE rtvideo_paused_sessions gauge
rtvideo_paused_sessions{instance="realtime_video_0_0",model="realtime_video"} 0
# HELP rtvideo_model_heartbeat_seconds Unix time of the model's last heartbeat (once a second while its request path works)
# TYPE rtvideo_model_heartbeat_seconds gauge
rtvideo_model_heartbeat_seconds{instance="realtime_video_0_0",model="realtime_video"} 1796647824.03438
# HELP rtvideo_sequence_slots Slots of Triton's sequence batcher for this model instance (max_candidate_sequences)
# TYPE rtvideo_sequence_slots gauge
rtvideo_sequence_slots{instance="realtime_video_0_0",model="realtime_video"} 8
# HELP rtvideo_sequence_slots_held Slots of the sequence batcher held by open sequences (sessions, unended starts) as the model sees them
# TYPE rtvideo_sequence_slots_held gauge
rtvideo_sequence_slots_held{instance="realtime_video_0_0",model="realtime_video"} 1
"""


def triton_text(held: float, slots: float = 8, instances: tuple[str, ...] = ("realtime_video_0_0",)) -> str:
    """Triton's /metrics as in `REAL_METRICS`, with `held` of `slots` per model instance."""
    lines = [
        "# HELP nv_inference_request_success Number of successful inference requests, all batch sizes",
        "# TYPE nv_inference_request_success counter",
        f'nv_inference_request_success{{model="{MODEL}",version="1"}} 42',
    ]
    for name, value in ((SLOTS_METRIC, slots), (HELD_METRIC, held)):
        lines.append(f"# HELP {name} {model_metrics.FAMILIES[name][0]}")
        lines.append(f"# TYPE {name} gauge")
        for instance in instances:
            labels = f'instance="{instance}",model="{MODEL}"' if instance else f'model="{MODEL}"'
            lines.append(f"{name}{{{labels}}} {value}")
    lines.append(f'rtvideo_model_heartbeat_seconds{{model="{MODEL}"}} 1765110000.25')
    return "\n".join(lines) + "\n"


def test_the_names_are_the_models() -> None:
    assert SLOTS_METRIC == model_metrics.SEQUENCE_SLOTS and HELD_METRIC == model_metrics.SEQUENCE_SLOTS_HELD


def test_the_real_models_text() -> None:
    assert slots_full_in(REAL_METRICS, MODEL) is False  # one of 8 held
    held = f'{HELD_METRIC}{{instance="realtime_video_0_0",model="realtime_video"}}'
    assert f"{held} 1\n" in REAL_METRICS
    assert slots_full_in(REAL_METRICS.replace(f"{held} 1\n", f"{held} 8\n"), MODEL) is True
    assert slots_full_in(REAL_METRICS, "realtime_video_paced") is None


@pytest.mark.parametrize(
    ("text", "full"),
    [
        (triton_text(held=6, slots=16), False),  # issue 46: at most 6 of 16 in use
        (triton_text(held=0), False),
        (triton_text(held=8), True),
        (triton_text(held=9), True),  # the model may count a sequence Triton just dropped
        (triton_text(held=8, instances=("realtime_video_0", "realtime_video_1")), True),
        ('rtvideo_model_heartbeat_seconds{model="realtime_video"} 1.0\n', None),  # a model that reports no slots
        (triton_text(held=8).replace(f'model="{MODEL}"', 'model="other"'), None),
        (f'{SLOTS_METRIC}{{model="{MODEL}"}} 8\n', None),  # slots without held: unknown, not full
    ],
)
def test_full_only_when_the_model_says_every_slot_is_held(text: str, full: bool | None) -> None:
    assert slots_full_in(text, MODEL) is full


def test_one_instance_with_a_free_slot_is_not_full() -> None:
    text = triton_text(held=8, instances=("realtime_video_0",)) + triton_text(held=3, instances=("realtime_video_1",))
    assert slots_full_in(text, MODEL) is False


# --- the supervisor's decision ----------------------------------------------------------------------
class _Late:
    """A backend whose probes time out (`answer` False) or are answered."""

    def __init__(self) -> None:
        self.answer = False

    async def probe(self, timeout: float) -> float:
        if not self.answer:
            raise ProbeTimeout(f"no answer to the health probe within {timeout:g} s")
        return 0.001

    async def reconnect(self) -> None: ...


class _Metrics:
    """The model's metrics as the heartbeat reads them: a moving heartbeat and `text`'s slots."""

    def __init__(self, text: str, moving: bool = True) -> None:
        self.text, self.moving, self.url = text, moving, "http://triton:8002/metrics"

    async def pulse(self) -> Pulse:
        return Pulse(moving=self.moving, full=slots_full_in(self.text, MODEL) if self.moving else None)


def _supervisor(backend: _Late, beat: _Metrics, downs: list[str], metrics: ProxyMetrics) -> Supervisor:
    return Supervisor(
        backend,  # type: ignore[arg-type]
        EndpointProbes(metrics, "triton", lambda: None),
        interval=0.01,
        timeout=5,
        failures=1,
        on_down=downs.append,
        heartbeat=beat,  # type: ignore[arg-type]
    )


def test_a_late_probe_with_free_slots_is_late_not_busy() -> None:
    """Issue 46: a probe answered after its deadline, the heartbeat moving, 6 of 16 slots held:
    late; the endpoint takes new sessions and counts as ready; no failure, however many in a row."""

    async def body() -> None:
        backend, beat, downs, metrics = _Late(), _Metrics(triton_text(held=6, slots=16)), [], ProxyMetrics()
        sup = _supervisor(backend, beat, downs, metrics)
        for _ in range(5):
            await sup.check()
        assert sup.state is BackendState.LATE and downs == [] and sup.failures == 0
        assert sup.admitting and sup.ready and sup.alive
        assert "late, not busy" in (sup.last_error or "")
        assert sup.status()["backend"] == "late"
        text = metrics.render()
        assert "rtvideo_proxy_probe_late_total 5.0" in text and "rtvideo_proxy_probe_busy_total 0.0" in text
        backend.answer = True
        await sup.check()
        assert sup.state is BackendState.UP and sup.last_error is None

        # Every slot held: busy (no new session), still no failure.
        backend.answer, beat.text = False, triton_text(held=16, slots=16)
        await sup.check()
        assert sup.state is BackendState.BUSY and not sup.admitting and sup.alive and downs == []
        # A slot frees while probes are still late: late again, admitting.
        beat.text = triton_text(held=15, slots=16)
        await sup.check()
        assert sup.state is BackendState.LATE and sup.admitting

    asyncio.run(asyncio.wait_for(body(), 20))


def test_a_model_that_reports_no_slots_is_late_never_busy() -> None:
    async def body() -> None:
        beat = _Metrics('rtvideo_model_heartbeat_seconds{model="realtime_video"} 1.0\n')
        sup = _supervisor(_Late(), beat, [], ProxyMetrics())
        await sup.check()
        assert sup.state is BackendState.LATE and "reports no sequence slots" in (sup.last_error or "")

    asyncio.run(asyncio.wait_for(body(), 20))


def test_a_frozen_heartbeat_is_a_failure_whatever_the_slots() -> None:
    async def body() -> None:
        downs: list[str] = []
        sup = _supervisor(_Late(), _Metrics(triton_text(held=0), moving=False), downs, ProxyMetrics())
        await sup.check()
        assert sup.state is BackendState.DOWN and len(downs) == 1 and "does not move" in downs[0]

    asyncio.run(asyncio.wait_for(body(), 20))


def test_a_session_failure_makes_a_late_endpoint_not_ready() -> None:
    async def body() -> None:
        sup = _supervisor(_Late(), _Metrics(triton_text(held=1)), [], ProxyMetrics())
        await sup.check()
        assert sup.ready
        sup.suspect("a session's stream failed")
        assert not sup.ready and not sup.alive and sup.admitting

    asyncio.run(asyncio.wait_for(body(), 20))


# --- the model's count -------------------------------------------------------------------------------
class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_model_counts_a_slot_from_a_sequences_first_request_to_its_end_or_idle_timeout() -> None:
    clock = _Clock()
    slots = SequenceSlots(8, idle_seconds=120.0, clock=clock)
    slots.request(1, end=False)  # a session's start
    slots.request(2, end=False)  # a start refused with server_busy, never ended
    slots.request(3, end=True)  # the health probe: START and END in one request
    assert slots.held() == 2 and slots.slots == 8
    clock.now += 100
    slots.request(1, end=False)  # the session's keep-alive
    assert slots.held() == 2
    clock.now += 30  # 130 s after sequence 2's only request: Triton's idle timeout freed it
    assert slots.held() == 1
    slots.request(1, end=True)  # session.stop with sequence_end
    assert slots.held() == 0


def test_without_an_idle_setting_tritons_default_applies() -> None:
    clock = _Clock()
    slots = SequenceSlots(None, idle_seconds=None, clock=clock)
    slots.request(7, end=False)
    assert slots.held() == 1
    clock.now += 1.5  # Triton's default max_sequence_idle_microseconds: 1 s
    assert slots.held() == 0


def test_the_count_is_bounded_whatever_clients_send() -> None:
    slots = SequenceSlots(8, idle_seconds=3600.0, clock=time.monotonic)
    for corrid in range(MAX_TRACKED + 10):
        slots.request(corrid, end=False)
    assert slots.held() == MAX_TRACKED
