"""Admission that cannot lock itself shut, and one batching rule for the session limit
(issue 47 items 1 and 2; `runtime/capacity.py`, `vllm_omni/engine_timing.py`,
`vllm_omni/engine_limits.py`). The arithmetic is pure and timed by a clock the test moves; the
engine's part runs the stand-in engine (its outputs carry stage times as the real engine's do
with its pipeline profiler on); tests/unit/backend/test_vllm_omni_real_engine_admission_cpu.py
runs the real one."""

from __future__ import annotations

import ast
import json

import pytest

from rtvideo.backend.loading.assembly import build_manager
from rtvideo.backend.loading.settings import BackendSettings
from rtvideo.backend.runtime.capacity import (
    IDLE_GRACE_SECONDS,
    IDLE_HALF_LIFE_SECONDS,
    RUNNING,
    RUNNING_WALL_CLOCK,
    TOLERANCE,
    RealtimeCapacity,
)
from rtvideo.backend.vllm_omni.engine_limits import batching_fields, engine_session_limit
from rtvideo.backend.vllm_omni.engine_timing import DECODE_SUFFIX, DENOISE_SUFFIX, ChunkTimer, compute_seconds
from rtvideo.core.session_config import resolve_session_config
from rtvideo.core.start_request import check_first_message, validate_start
from tests.support.paths import STANDIN_ENGINE
from tests.support.recorder import Recorder
from tests.support.runtime_standins import SECRET
from tests.support.vllm_omni_wheel import wheel_source

SETTINGS = BackendSettings(width=64, height=64)


def _config(**fields: object):  # type: ignore[no-untyped-def]
    start = validate_start(check_first_message(json.dumps({"type": "session.start", "prompt": "p", **fields}).encode()))
    return resolve_session_config(start, SETTINGS.capabilities("m"))


class Clock:
    """Monotonic seconds that only move when the test says."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _measured(fps: float, clock: Clock, at_load: float | None = None) -> RealtimeCapacity:
    """A 64x64 model whose running figure is `fps` (three chunks of 49 frames, all alike)."""
    capacity = RealtimeCapacity(64, 64, clock=clock)
    if at_load is not None:
        capacity.measured(at_load, "warm-up at load")
    for _ in range(3):
        capacity.observe(49, 49 / fps, 64, 64, 1)
    return capacity


# --- never refused on an idle model; a tolerance ----------------------------------------------------
def test_a_5_fps_model_measured_at_4_9_admits_the_next_start_once_every_session_ended() -> None:
    """The lock-shut scenario: the running figure landed below one session's fps. A start beside a
    live session is refused (it would not play in real time), but with no session live the next
    start is admitted, again and again: the model never refuses for good."""
    clock = Clock()
    capacity = _measured(4.9, clock)
    assert capacity.fps == pytest.approx(4.9)
    five = _config(fps=5)
    refused = capacity.refusal(five, [five])  # one live at 5 fps: 10 is far above 4.9 and its tolerance
    assert refused is not None and "take 5 and this start asks 5" in refused and "tolerance" in refused
    for _ in range(3):
        assert capacity.refusal(five, []) is None  # every session ended: admitted
        clock.now += 1
    assert capacity.refusal(_config(fps=60, width=512, height=512), []) is None  # whatever it asks


def test_a_start_is_refused_only_beyond_the_figure_and_its_tolerance() -> None:
    capacity = RealtimeCapacity(64, 64, 10.0)
    live = [_config(fps=5)]
    assert capacity.refusal(_config(fps=5), live) is None  # 10 of 10
    assert TOLERANCE == 0.10
    assert capacity.refusal(_config(fps=6), live) is None  # 11: within 10%
    why = capacity.refusal(_config(fps=7), live)  # 12: beyond
    assert why is not None and "about 10 frames per second" in why and "10% tolerance" in why
    assert capacity.describe(live)["realtime_capacity_tolerance"] == TOLERANCE


# --- the figure returns to the load-time one when nothing runs -----------------------------------
def test_an_idle_running_figure_decays_back_to_the_load_time_figure() -> None:
    clock = Clock()
    capacity = _measured(50.0, clock, at_load=100.0)
    assert capacity.fps == pytest.approx(50.0) and capacity.describe()["realtime_capacity_from"] == RUNNING
    clock.now += IDLE_GRACE_SECONDS  # a gap between chunks: nothing moves
    assert capacity.fps == pytest.approx(50.0)
    clock.now += IDLE_HALF_LIFE_SECONDS  # one half-life idle: half way back
    assert capacity.fps == pytest.approx(75.0)
    assert capacity.describe()["realtime_capacity_from"] == "running, returning to warm-up at load (idle)"
    clock.now += 20 * IDLE_HALF_LIFE_SECONDS
    assert capacity.fps == pytest.approx(100.0, abs=0.01)


def test_with_no_load_time_figure_an_idle_running_figure_is_forgotten() -> None:
    """vLLM-Omni measures nothing at load: the running figure holds two half-lives, then the model
    knows no figure (refusing nothing but the session limit) until a session measures it again."""
    clock = Clock()
    capacity = _measured(4.9, clock)
    clock.now += IDLE_GRACE_SECONDS + 1.9 * IDLE_HALF_LIFE_SECONDS
    assert capacity.fps == pytest.approx(4.9)
    clock.now += 0.2 * IDLE_HALF_LIFE_SECONDS
    assert capacity.fps is None and capacity.describe()["realtime_capacity_from"] is None
    assert capacity.refusal(_config(fps=5), [_config(fps=5)] * 4) is None


def test_a_run_after_an_idle_spell_is_measured_afresh_and_a_run_is_not_decayed() -> None:
    clock = Clock()
    capacity = _measured(4.9, clock)
    for _ in range(20):  # a long session: chunks keep coming, nothing decays
        clock.now += 2.0
        capacity.observe(49, 10.0, 64, 64, 1)
    assert capacity.fps == pytest.approx(4.9)
    clock.now += IDLE_GRACE_SECONDS + 1
    capacity.observe(60, 10.0, 64, 64, 1)  # the next run: its own chunks only, not the old median
    assert capacity.fps == pytest.approx(6.0)


def test_the_figure_counts_the_requests_that_run_at_once() -> None:
    """A batched chunk's time is the whole batch's: two requests running together make twice the
    frames in it. A request waiting inside the engine is not counted by the engine host."""
    capacity = RealtimeCapacity(64, 64)
    capacity.observe(10, 1.0, 64, 64, 2)
    assert capacity.fps == 20.0
    alone = RealtimeCapacity(64, 64)
    alone.observe(10, 1.0, 64, 64, 1, RUNNING_WALL_CLOCK)
    assert alone.fps == 10.0 and alone.describe()["realtime_capacity_from"] == RUNNING_WALL_CLOCK


# --- the engine's own per-chunk time --------------------------------------------------------------
class _Output:
    def __init__(self, durations: dict[str, float]) -> None:
        self.stage_durations = durations


def test_a_chunks_engine_time_is_the_growth_of_its_denoise_and_decode_times() -> None:
    """The outputs carry the request's totals so far (seconds per stage); other stages (the prompt's
    encoding, the orchestrator's `stage_0_gen_ms`) do not count."""
    timer = ChunkTimer()
    first = {"HeliosPyramidPipeline.text_encoder.forward": 0.5, "HeliosPyramidPipeline.diffuse": 2.0}
    assert timer.chunk_seconds(_Output({**first, "HeliosPyramidPipeline.vae.decode": 0.25})) == 2.25
    later = {**first, "HeliosPyramidPipeline.diffuse": 3.0, "HeliosPyramidPipeline.vae.decode": 0.5}
    assert timer.chunk_seconds(_Output({**later, "stage_0_gen_ms": 9000.0})) == pytest.approx(1.25)
    assert timer.chunk_seconds(_Output({"stage_0_gen_ms": 1.0})) is None  # the profiler off
    assert timer.chunk_seconds(object()) is None
    assert compute_seconds(None) is None and compute_seconds({"x.diffuse": "?"}) is None
    # LingBot-World's pipeline times its decode but not its denoising: no chunk time (wall clock)
    assert compute_seconds({"P._streaming_decode_chunk": 1.0, "P.vae.decode": 0.5}) is None


def test_the_stage_keys_are_the_wheels_own() -> None:
    """`forward_time_ms` and `vae_decode_time_ms` are vLLM-Omni's sums over these suffixes
    (`metrics/utils.py`), and `AsyncOmni` hands the engine's `stage_durations` on to its caller
    (`entrypoints/omni_base.py`), replacing its `metrics`."""
    tree = ast.parse(wheel_source("vllm_omni/metrics/utils.py"))
    suffixes = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name.startswith("extract_diffusion_"):
            (ret,) = [n for n in ast.walk(node) if isinstance(n, ast.Return)]
            assert isinstance(ret.value, ast.Call)
            suffixes[node.name] = ret.value.args[1].value  # type: ignore[attr-defined]
    assert suffixes == {
        "extract_diffusion_vae_decode_ms": DECODE_SUFFIX,
        "extract_diffusion_denoise_ms": DENOISE_SUFFIX,
    }
    base = wheel_source("vllm_omni/entrypoints/omni_base.py")
    assert "stage_durations=stage_durations," in base and "metrics=response_metrics," in base
    # LingBot-World names its own targets, without `denoise_step`: its figure is the wall-clock one
    lingbot = ast.parse(wheel_source("vllm_omni/diffusion/models/lingbot_world/pipeline.py"))
    (targets,) = [
        kw.value
        for node in ast.walk(lingbot)
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "setup_diffusion_pipeline_profiler"
        for kw in node.keywords
        if kw.arg == "profiler_targets"
    ]
    assert isinstance(targets, ast.List)
    named = [e.value for e in targets.elts if isinstance(e, ast.Constant)]
    assert "_streaming_decode_chunk" in named and "denoise_step" not in named and "diffuse" not in named


# --- one batching rule -----------------------------------------------------------------------------
def test_the_batching_fields_are_in_the_wheels_step_batching_key() -> None:
    tree = ast.parse(wheel_source("vllm_omni/diffusion/sched/interface.py"))
    (key,) = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "StepBatchSamplingParamsKey"]
    fields = {n.target.id for n in key.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    assert {"width", "height", "num_frames", "fps", "guidance_scale", "lora_int_id", "lora_scale"} <= fields
    caps = BackendSettings(generator="vllm_omni").capabilities("m")
    assert batching_fields(caps) == ("num_frames", "width/height", "fps", "guidance", "lora")


def test_auto_follows_max_num_seqs_only_where_every_session_shares_the_batching_key() -> None:
    shared = engine_session_limit(4, "the engine's diffusion config", (), None)
    assert shared.sessions == 4 and "shares the engine's batching key" in shared.reason
    apart = engine_session_limit(4, "the engine's diffusion config", ("num_frames", "fps"), None)
    assert apart.sessions == 1 and "max_num_seqs=4" in apart.reason and "num_frames, fps" in apart.reason
    one = engine_session_limit(1, "vLLM-Omni's default", ("num_frames",), None)
    assert one.sessions == 1 and "one request at a time" in one.reason
    chosen = engine_session_limit(4, "x", ("num_frames",), 2)
    assert chosen.sessions == 2 and "set by the deployer" in chosen.reason and "wait inside the engine" in chosen.reason


def test_a_vllm_omni_model_runs_one_session_at_a_time_and_says_why() -> None:
    """The stand-in engine at max_num_seqs=3: sessions here ask their own num_frames, so `auto` is 1,
    and the pong (so /v1/models) gives the reason."""
    base = {"generator": "vllm_omni", "width": "128", "height": "128", "vllm_omni_engine": STANDIN_ENGINE}
    roomy = {**base, "vllm_omni_engine_args": json.dumps({"max_num_seqs": 3})}
    manager = build_manager(BackendSettings.from_parameters(roomy), "m")
    try:
        status = manager.status()
        assert status["max_sessions"] == 1
        assert "max_num_seqs=3" in str(status["max_sessions_reason"]) and "num_frames" in str(
            status["max_sessions_reason"]
        )
    finally:
        manager.shutdown()


# --- through the engine host (the stand-in engine) --------------------------------------------------
def _run(manager, corrid: int, **fields: object) -> list[str]:  # type: ignore[no-untyped-def]
    ch = Recorder()
    start = json.dumps({"type": "session.start", "prompt": "a harbour", **fields}).encode()
    manager.on_request(corrid, start, start=True, end=False, channel=ch, secret=SECRET)
    assert ch.finished.wait(60), ch.types()
    return ch.types()


@pytest.mark.parametrize("profiled", [True, False])
def test_the_engine_figure_comes_from_its_own_chunk_times(profiled: bool) -> None:
    """The stand-in reports exactly its paced 0.05 s a chunk, as the engine's profiler would
    report its compute time; the figure is then exactly 4 frames / 0.05 s. With the profiler off
    the outputs carry no times and the figure is the wall-clock one, said so."""
    capacity = RealtimeCapacity(128, 128)
    args = {"frames_per_chunk": 4, "chunk_seconds": 0.05}
    if not profiled:
        args["enable_diffusion_pipeline_profiler"] = False  # the deployer's word wins
    params = {
        "generator": "vllm_omni",
        "width": "128",
        "height": "128",
        "frames_per_chunk": "4",
        "vllm_omni_engine": STANDIN_ENGINE,
        "vllm_omni_engine_args": json.dumps(args),
    }
    manager = build_manager(BackendSettings.from_parameters(params), "m", capacity=capacity)
    try:
        types = _run(manager, 1, num_frames=16)
        assert types[0] == "video.start" and types[-1] == "session.done", types
        described = capacity.describe()
        if profiled:
            assert described == {**described, "realtime_capacity_from": RUNNING, "realtime_capacity_fps": 80.0}
        else:
            assert described["realtime_capacity_from"] == RUNNING_WALL_CLOCK and described["realtime_capacity_fps"]
    finally:
        manager.shutdown()


def test_after_an_unlucky_slow_measurement_the_next_start_is_admitted() -> None:
    """A session runs; then a slow figure is measured (injected through `observe`, the seam the
    engine host reports through): far below one session's fps. The next start, with nothing
    live, gets `video.start`, and its own chunks measure the engine again."""
    capacity = RealtimeCapacity(128, 128)
    params = {
        "generator": "vllm_omni",
        "width": "128",
        "height": "128",
        "frames_per_chunk": "4",
        "vllm_omni_engine": STANDIN_ENGINE,
        "vllm_omni_engine_args": json.dumps({"frames_per_chunk": 4, "chunk_seconds": 0.05}),
    }
    manager = build_manager(BackendSettings.from_parameters(params), "m", capacity=capacity)
    try:
        assert _run(manager, 1, num_frames=16, fps=16)[0] == "video.start"
        for _ in range(8):
            capacity.observe(1, 10.0, 128, 128, 1)  # 0.1 fps: a host that stalled, a compile
        assert capacity.fps == pytest.approx(0.1)
        assert _run(manager, 2, num_frames=16, fps=16)[0] == "video.start"
    finally:
        manager.shutdown()
