"""The model's session limit follows its engine, and its real-time capacity decides which starts
fit (docs/triton-model.md "Real-time capacity"; `runtime/capacity.py`, `vllm_omni/engine_limits.py`)."""

from __future__ import annotations

import ast
import json

import pytest
import yaml

from rtvideo.backend.builtin import warmup
from rtvideo.backend.builtin.generator import BuiltinGenerator
from rtvideo.backend.loading.assembly import build_manager
from rtvideo.backend.loading.settings import BUILTIN_MAX_SESSIONS, BackendSettings
from rtvideo.backend.runtime.capacity import RealtimeCapacity, parse_setting
from rtvideo.backend.vllm_omni.engine_limits import (
    WHEEL_DEFAULT_MAX_NUM_SEQS,
    configured_max_num_seqs,
    engine_max_num_seqs,
)
from rtvideo.core.session_config import resolve_session_config
from rtvideo.core.start_request import check_first_message, validate_start
from tests.support.paths import REPO_ROOT, STANDIN_ENGINE
from tests.support.recorder import Recorder
from tests.support.runtime_standins import SECRET
from tests.support.vllm_omni_wheel import wheel_source

SETTINGS = BackendSettings(width=64, height=64)


def _config(**fields: object):  # type: ignore[no-untyped-def]
    start = validate_start(check_first_message(json.dumps({"type": "session.start", "prompt": "p", **fields}).encode()))
    return resolve_session_config(start, SETTINGS.capabilities("m"))


# --- the arithmetic ------------------------------------------------------------------------------
def test_a_sessions_load_is_its_fps_at_the_default_sizes_pixels() -> None:
    capacity = RealtimeCapacity(64, 64, 100.0)
    assert capacity.load(_config()) == 16
    assert capacity.load(_config(width=128, height=128, fps=8)) == 32  # four times the pixels, half the fps


def test_a_start_that_does_not_fit_beside_the_live_sessions_is_refused() -> None:
    capacity = RealtimeCapacity(64, 64, 40.0)
    live = [_config(), _config()]
    assert capacity.refusal(_config(fps=8), live) is None  # 16 + 16 + 8 = 40
    why = capacity.refusal(_config(), live)
    assert why is not None and "about 40 frames per second" in why and "take 32" in why and "asks 16" in why


def test_unknown_or_off_refuses_nothing_and_a_fixed_figure_is_not_moved_by_measurements() -> None:
    assert RealtimeCapacity(64, 64).refusal(_config(fps=60), [_config()] * 50) is None  # nothing measured yet
    off = RealtimeCapacity(64, 64, "off")
    off.measured(10.0, "warm-up at load")
    assert off.fps == 10.0 and off.refusal(_config(), [_config()]) is None  # measured, shown, not refusing
    fixed = RealtimeCapacity(64, 64, 40.0)
    fixed.measured(1000.0, "warm-up at load")
    fixed.observe(9, 0.01, 64, 64, 1)
    assert fixed.fps == 40.0 and fixed.describe()["realtime_capacity_from"] == "setting"


def test_the_running_figure_is_the_median_of_the_engines_latest_chunks() -> None:
    capacity = RealtimeCapacity(64, 64)
    for seconds in (1.0, 1.0, 1.0, 10.0):  # one slow chunk (a compile, a loaded host) does not move it
        capacity.observe(8, seconds, 64, 64, 1)
    assert capacity.fps == 8.0
    capacity.observe(8, 1.0, 128, 64, 2)  # two requests at twice the pixels: 32 default-size frames a second
    assert capacity.fps == 8.0 and capacity.describe()["realtime_capacity_from"] == "running"


def test_the_setting_takes_auto_off_or_a_positive_number() -> None:
    assert parse_setting("auto") == "auto" and parse_setting(" OFF ") == "off" and parse_setting("12.5") == 12.5
    for bad in ("0", "-3", "nan", "inf", "fast"):
        with pytest.raises(ValueError, match="realtime_capacity_fps"):
            parse_setting(bad)
    with pytest.raises(ValueError, match="realtime_capacity_fps"):
        BackendSettings.from_parameters({"realtime_capacity_fps": "fast"})


# --- the built-in generator's warm-up --------------------------------------------------------------
def test_the_builtin_default_measures_at_least_eight_sessions_on_two_cores() -> None:
    """The promise of the default settings (256x256, 16 fps, chunks of 9, two render workers): at
    least 8 sessions in real time on 2 cores. Counted in CPU time, so a loaded machine measures
    what a chunk costs, not how long others made it wait."""
    defaults = BackendSettings()
    generator = BuiltinGenerator(device="cpu", fps=defaults.fps)
    rate = warmup.frames_per_second(
        generator, defaults.width, defaults.height, defaults.fps, defaults.frames_per_chunk, "cpu"
    )
    on_two_cores = rate * min(defaults.render_workers, 2)
    assert on_two_cores >= 8 * defaults.fps, rate


def test_a_builtin_model_measures_itself_at_load_and_its_probe_says_so() -> None:
    manager = build_manager(BackendSettings(width=64, height=64, render_workers=0), "m")
    try:
        ch = Recorder()
        manager.on_request(1, b'{"type":"session.ping","status":true}', start=True, end=True, channel=ch)
        assert ch.finished.wait(5)
        (pong,) = [message for message, _, _ in ch.sent]
        model = pong["model"]
        assert model["max_sessions"] == BUILTIN_MAX_SESSIONS and model["sessions"] == 0
        assert model["realtime_capacity_from"] == "warm-up at load" and model["realtime_capacity_fps"] > 16
        assert model["refuses_above_capacity"] is True
    finally:
        manager.shutdown()


def test_a_builtin_model_refuses_a_start_beyond_its_capacity_with_server_busy() -> None:
    manager = build_manager(
        BackendSettings(width=64, height=64, render_workers=0, realtime_capacity_fps="20", pacing_lead_chunks=1.0),
        "m",
    )
    try:
        first, second = Recorder(), Recorder()
        start = json.dumps({"type": "session.start", "prompt": "p", "fps": 16}).encode()
        manager.on_request(1, start, start=True, end=False, channel=first, secret=SECRET)
        manager.on_request(2, start, start=True, end=False, channel=second, secret=SECRET)
        assert second.finished.wait(5)
        refused = [message for message, _, _ in second.sent]
        assert [m["type"] for m in refused] == ["error", "session.done"] and refused[0]["code"] == "server_busy"
        assert "take 16 and this start asks 16" in refused[0]["message"]
        assert first.sent[0][0]["type"] == "video.start"
    finally:
        manager.shutdown()


# --- the engine's session limit ----------------------------------------------------------------------
def test_max_sessions_auto_follows_the_engine_and_a_larger_number_fails_the_load() -> None:
    assert BackendSettings().session_limit() == BUILTIN_MAX_SESSIONS
    assert BackendSettings(max_sessions="3").session_limit() == 3
    assert BackendSettings().session_limit(1, "vLLM-Omni's default") == 1
    assert BackendSettings(max_sessions=1).session_limit(2, "x") == 1
    with pytest.raises(ValueError) as refused:
        BackendSettings(max_sessions=4).session_limit(1, "the deploy config's max_num_seqs (d.yaml)")
    words = str(refused.value)
    assert "max_sessions=4" in words and "max_num_seqs=1" in words and "d.yaml" in words
    for bad in ("0", "many"):
        with pytest.raises(ValueError, match="max_sessions"):
            BackendSettings.from_parameters({"max_sessions": bad})


def test_the_engines_max_num_seqs_is_its_own_else_its_arguments_else_the_deploy_config(tmp_path) -> None:
    deploy = tmp_path / "d.yaml"
    deploy.write_text(yaml.safe_dump({"stages": [{"stage_id": 0, "max_num_seqs": 2}]}))
    running = type("OdConfig", (), {"max_num_seqs": 3})()
    assert engine_max_num_seqs(running, {"max_num_seqs": 5})[0] == 3  # as the engine has it
    assert engine_max_num_seqs(None, {"max_num_seqs": 5, "deploy_config": str(deploy)})[0] == 5
    assert engine_max_num_seqs(None, {"max_batch_size": 6})[0] == 6  # the legacy name
    assert configured_max_num_seqs({"deploy_config": str(deploy)}) == (
        2,
        f"the deploy config's max_num_seqs ({deploy})",
    )
    assert configured_max_num_seqs({}) == (WHEEL_DEFAULT_MAX_NUM_SEQS, "vLLM-Omni's default")


def test_the_wheels_default_and_the_shipped_lingbot_deploy_run_one_request() -> None:
    tree = ast.parse(wheel_source("vllm_omni/diffusion/data.py"))
    config = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "OmniDiffusionConfig")
    (default,) = [
        n.value
        for n in config.body
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.target.id == "max_num_seqs"
    ]
    assert isinstance(default, ast.Constant) and default.value == WHEEL_DEFAULT_MAX_NUM_SEQS == 1
    shipped = REPO_ROOT / "deploy" / "gpu" / "lingbot_world_stepwise.yaml"
    assert configured_max_num_seqs({"deploy_config": str(shipped)})[0] == 1


def test_a_vllm_omni_model_follows_its_engine_or_refuses_to_load() -> None:
    base = {"generator": "vllm_omni", "width": "128", "height": "128", "vllm_omni_engine": STANDIN_ENGINE}
    manager = build_manager(BackendSettings.from_parameters(base), "m")
    try:
        assert manager.status()["max_sessions"] == 1  # auto: the stand-in's default, as the wheel's
    finally:
        manager.shutdown()
    roomy = {**base, "vllm_omni_engine_args": json.dumps({"max_num_seqs": 3}), "max_sessions": "2"}
    manager = build_manager(BackendSettings.from_parameters(roomy), "m")
    try:
        assert manager.status()["max_sessions"] == 2
    finally:
        manager.shutdown()
    with pytest.raises(ValueError, match=r"max_sessions=2 is above the engine's max_num_seqs=1"):
        build_manager(BackendSettings.from_parameters({**base, "max_sessions": "2"}), "m")
