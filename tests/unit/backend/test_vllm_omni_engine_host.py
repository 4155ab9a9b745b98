"""`EngineHost` hands interactions to the engine in order, as soon as the engine can take them,
and never after their request ended.

vLLM-Omni 0.30 refuses an interaction its worker cannot apply yet (no request state before the
scheduler admits the request; no encoded prompt before its first step), and a refusal aborts the
request. Its engine says when it admits a request if asked (`emit_request_lifecycle`), and runs
interactions between scheduler steps; the tests at the end read that in the pinned wheel.

The engine here is a scripted fake on the host's own loop: each test decides when the engine
admits the request, yields its first output, or finishes taking an interaction.
"""

from __future__ import annotations

import ast
import asyncio
import concurrent.futures
import threading
import time
from dataclasses import dataclass, field, fields, make_dataclass
from typing import Any

import numpy as np
import pytest

from rtvideo.backend.vllm_omni import engine as engine_module
from rtvideo.backend.vllm_omni.engine import EngineError, EngineHost, EngineRequest
from rtvideo.backend.vllm_omni.output_queue import OutputQueue
from rtvideo.core.session_config import SessionConfig
from tests.support.omni_standin import StandInSamplingParams
from tests.support.session_configs import session_config
from tests.support.vllm_omni_wheel import wheel_source

#: `OmniDiffusionSamplingParams`' fields the host sets (`emit_request_lifecycle` included)
Params = StandInSamplingParams
#: the params of an engine without the lifecycle opt-in: its first output is the only sign
OldParams = make_dataclass(
    "OldParams",
    [
        (f.name, f.type, field(default=f.default, default_factory=f.default_factory))
        for f in fields(Params)
        if f.name != "emit_request_lifecycle"
    ],
)


@dataclass
class Output:
    images: list[Any]
    custom_output: dict[str, Any] = field(default_factory=dict)
    finished: bool = False


class ScriptedEngine:
    """Admits the request when `admit` is set, yields outputs when `produce` is set, and takes an
    interaction when `take` is set (it is set unless a test clears it)."""

    def __init__(self, model: str = "", params: type = Params, **_: Any) -> None:
        self.loop = asyncio.get_running_loop()  # the host makes its engine on the engine's loop
        self.default_sampling_params_list = [params()]
        self.calls: list[tuple[str, Any]] = []
        self.admitted = False
        self.admit = asyncio.Event()
        self.produce = asyncio.Event()
        self.take = asyncio.Event()
        self.take.set()

    async def generate(self, prompt: Any, request_id: str = "", *, sampling_params_list: Any = None, **_: Any) -> Any:
        (params,) = sampling_params_list
        await self.admit.wait()
        self.admitted = True
        if getattr(params, "emit_request_lifecycle", False):  # as the diffusion engine's busy loop
            yield Output([], {"_diffusion_request_lifecycle": "started"})
        await self.produce.wait()
        for index in range(3):
            self.calls.append(("output", index))
            yield Output([np.zeros((1, 1, 8, 8, 3), np.float32)], finished=index == 2)
            await asyncio.sleep(0)

    async def submit_interaction_async(self, request_id: str, *, interaction: dict[str, Any]) -> None:
        # the real engine refuses (and aborts the request) before the scheduler admitted it
        self.calls.append(("submit" if self.admitted else "refused: not admitted", interaction["event_id"]))
        await self.take.wait()

    async def abort(self, request_id: str, *, timeout: float | None = None) -> None:
        self.calls.append(("abort", request_id))

    async def check_health(self) -> None:
        return None

    def shutdown(self, timeout: float | None = None) -> None:
        return None


def config() -> SessionConfig:
    return session_config(
        prompt="p", format="h264", width=8, height=8, frames_per_chunk=1, default_transition_chunks=1, num_frames=3
    )


def started(params: type = Params) -> tuple[EngineHost, ScriptedEngine, OutputQueue]:
    engines: list[ScriptedEngine] = []

    def engine_of(**kwargs: Any) -> ScriptedEngine:
        engines.append(ScriptedEngine(params=params, **kwargs))
        return engines[-1]

    host = EngineHost(engine_of, model="m", engine_args={}, health_seconds=60)
    sink = OutputQueue()
    host.start_request(EngineRequest("r", {"prompt": "p"}, config(), 3, {}, sink))
    (engine,) = engines
    return host, engine, sink


def on_loop(engine: ScriptedEngine, action: Any) -> None:
    """Run `action()` on the engine's loop (the fake's events belong to it) and wait for it."""
    done = threading.Event()

    def run() -> None:
        action()
        done.set()

    engine.loop.call_soon_threadsafe(run)
    assert done.wait(10)


def wait_for(predicate: Any, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def event(event_id: str) -> dict[str, Any]:
    return {"event_id": event_id, "event": {"prompt": f"prompt {event_id}"}, "transition_chunks": 1}


def submitted(engine: ScriptedEngine) -> list[Any]:
    return [c for c in list(engine.calls) if c[0] != "abort"]


# --- the ordering lock and the end of a request ------------------------------------------------
def test_an_interaction_queued_behind_another_never_reaches_an_ended_request() -> None:
    """The race: an interaction waiting for the ordering lock while the one ahead of it is in the
    engine held the lock object itself, so after the request ended (its lock gone from the host)
    it still took the lock and reached the engine, for a request the engine had aborted."""
    host, engine, _ = started()
    try:
        on_loop(engine, engine.admit.set)
        on_loop(engine, engine.take.clear)  # the engine is slow to take the first interaction
        first = host.interact("r", event("a"))
        second = host.interact("r", event("b"))  # waits for the lock the first one holds
        wait_for(lambda: ("submit", "a") in engine.calls)
        host.end_request("r")
        wait_for(lambda: ("abort", "r") in engine.calls)
        on_loop(engine, engine.take.set)
        first.result(10)
        with pytest.raises(EngineError, match="ended before the interaction reached the engine"):
            second.result(10)
        assert ("submit", "b") not in engine.calls
    finally:
        host.shutdown()


def test_an_interaction_after_the_end_fails_at_once() -> None:
    host, engine, _ = started()
    try:
        host.end_request("r")
        with pytest.raises(EngineError, match="not running"):
            host.interact("r", event("late")).result(10)
        assert submitted(engine) == []
    finally:
        host.shutdown()


# --- as soon as the engine can take them --------------------------------------------------------
def test_interactions_go_in_order_once_the_engine_admits_the_request_before_any_output() -> None:
    host, engine, sink = started()
    try:
        futures = [host.interact("r", event(e)) for e in ("a", "b", "c")]
        time.sleep(0.2)
        assert submitted(engine) == []  # not admitted: the engine would refuse and abort the request
        on_loop(engine, engine.admit.set)  # its start notice: no output yet
        concurrent.futures.wait(futures, 10)
        assert [f.exception() for f in futures] == [None, None, None]
        assert submitted(engine) == [("submit", "a"), ("submit", "b"), ("submit", "c")]
        on_loop(engine, engine.produce.set)
        kinds = [sink.get(timeout=10)[0] for _ in range(4)]
        assert kinds == ["output", "output", "output", "end"]  # the notice is no chunk
        assert engine.default_sampling_params_list[0].emit_request_lifecycle is False  # a copy was asked
    finally:
        host.shutdown()


def test_without_a_start_notice_interactions_wait_for_the_first_output() -> None:
    host, engine, _ = started(OldParams)
    try:
        future = host.interact("r", event("a"))
        on_loop(engine, engine.admit.set)
        time.sleep(0.2)
        assert submitted(engine) == []
        on_loop(engine, engine.produce.set)
        future.result(10)
        assert submitted(engine)[:2] == [("output", 0), ("submit", "a")]
    finally:
        host.shutdown()


def test_an_interaction_held_for_the_engine_fails_when_the_request_ends_first() -> None:
    host, engine, _ = started()
    try:
        future = host.interact("r", event("a"))
        host.end_request("r")
        with pytest.raises(EngineError, match="ended before"):
            future.result(10)
        assert submitted(engine) == []
    finally:
        host.shutdown()


# --- what the pinned wheel does -----------------------------------------------------------------
def test_the_start_notice_is_the_wheels() -> None:
    data = wheel_source("vllm_omni/diffusion/data.py")
    assert f'DIFFUSION_REQUEST_LIFECYCLE_KEY = "{engine_module.LIFECYCLE_KEY}"' in data
    assert f'DIFFUSION_REQUEST_STARTED = "{engine_module.LIFECYCLE_STARTED}"' in data
    tree = ast.parse(wheel_source("vllm_omni/inputs/data.py"))
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "OmniDiffusionSamplingParams")
    fields = {n.target.id for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    assert "emit_request_lifecycle" in fields
    assert engine_module.ask_for_start_notice(Params()) and not engine_module.ask_for_start_notice(OldParams())


def test_the_wheel_runs_an_interaction_only_after_the_step_that_admitted_the_request() -> None:
    """The busy loop puts the notice out, runs the admitting step (the runner makes the request's
    state and runs `prepare_encode`), and only then runs queued interactions (`collective_rpc`);
    the next pass runs them before scheduling again, after that step too."""
    source = wheel_source("vllm_omni/diffusion/diffusion_engine.py")
    loop = source[source.index("    def _busy_loop(self)") :]
    loop = loop[: loop.index("\n    def ", 10)]
    notice = loop.index("self._emit_request_started_outputs(sched_output)")
    step = loop.index("self.execute_fn(sched_output)")
    interactions = loop.index("self._process_rpc_queue()", step)
    assert loop.index("self._process_rpc_queue()") < loop.index("self.scheduler.schedule()") < notice
    assert notice < step < interactions
    runner = wheel_source("vllm_omni/diffusion/worker/diffusion_model_runner.py")
    assert "self.state_cache[request_id] = new_state" in runner and "pipeline.prepare_encode(state)" in runner
    assert "No active request state for interaction" in runner  # what an early one would hit
