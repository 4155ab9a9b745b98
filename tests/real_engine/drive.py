"""The checks of scripts/test_real_engine.sh: vLLM-Omni 0.30.0's REAL engine inside a real
tritonserver's Python-backend stub, driven through the WebSocket proxy.

Run by the script, in its own environment (.venv-real-engine: the GPU lock, the CPU patches of
tests/real_engine/cpu_platform.py); never collected by pytest (not a test_*.py file):

    python -m tests.real_engine.drive [--keep DIR] [--only SUITE_OR_CHECK ...]

For each suite (`SUITES`: a tiny random Helios, `tests/support/omni_cpu.py`, with the checks
below; a tiny random LingBot-World, tests/real_engine/lingbot.py) it writes the model, starts
`rtvideo serve --generator vllm_omni` on it as a deployer would (Triton from the nvidia-pytriton
wheel, this checkout's model repository, the engine loaded by the model inside the stub, the
proxy in front), runs the suite's checks, stops it (nothing may be left running); then it
prints `real-engine: N passed, M failed` as its last line (exit status 1 unless M is 0).

What a CPU run proves: the engine's own request, interaction, abort and output code, started
the way the stub starts it, through our adapter, model and proxy; not its kernels, its speed
(see scripts/gpu_check.sh) or its GPU memory.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest  # tests/support's clients fail with pytest.fail.Exception (a BaseException)

from tests.real_engine import lingbot
from tests.real_engine.served import (
    CHUNK_TIMEOUT,
    FPS,
    Deployment,
    Served,
    cmdline,
    exe,
    finish,
    media,
    one_chunk,
    png_data_url,
    refused_start,
    run,
    serve,
    stop,
    tail,
)
from tests.support.omni_cpu import write_tiny_helios
from tests.support.processes import descendants
from tests.support.proxy_client import Ws, is_error, ws
from tests.support.streams import Transcript, check_stream_rules, decode, distance

#: the session size: the smallest the Helios-Distilled rules allow (sides on its 64-pixel grid, >= 128)
W = H = 128
FPC = 33  # Helios' chunk


# --- the checks: each returns what it saw in a few words, or raises ------------------------------


#: processes our own code starts below the stub (rtvideo's watchdog, multiprocessing's tracker)
_NOT_THE_ENGINE = ("rtvideo.process.watchdog", "multiprocessing.resource_tracker")
#: the inline diffusion worker's line once its device is set up (both releases log it)
_WORKER_UP = "diffusion_worker Worker 0: Initialized device"


def check_engine_in_stub(served: Served) -> str:
    """The engine runs in Triton's Python-backend stub, on this env's Python: vLLM-Omni runs its
    diffusion worker inline (0.30: `inline_stage_diffusion_client`, which titles the stub process
    `vLLM-Omni::DiffusionWorker`; 0.32: the UniProc executor, which leaves the host process's
    title alone, `set_proc_title=False`). Either way the worker came up, and no process below the
    stub is an engine process of its own; any process the engine spawns descends from the stub."""
    tree = descendants(served.proc.pid)
    stubs = [p for p in tree if Path(exe(p)).name == "triton_python_backend_stub"]
    assert len(stubs) == 1, f"want one stub below serve: {[(p, exe(p), cmdline(p)[:60]) for p in tree]}"
    (stub,) = stubs
    title = cmdline(stub)
    below = sorted(descendants(stub))
    log = tail(served.triton_log, 10**7)
    assert "engine" in log and "ready" in log, "the Triton log has no 'engine ... ready' line"
    titled = "DiffusionWorker" in title
    if not titled:  # 0.32: the worker inline without a title; nothing else may be running it
        others = [cmdline(p) for p in below if not any(n in cmdline(p) for n in _NOT_THE_ENGINE)]
        assert _WORKER_UP in log, f"no diffusion worker came up (no {_WORKER_UP!r} in the Triton log)"
        assert not others, f"processes below the stub besides ours (an engine process?): {others}"
    python = os.path.realpath(sys.executable)
    spawned = [p for p in below if os.path.realpath(exe(p)) == python]
    return (
        f"stub pid {stub} ({exe(stub)}) titled {title!r}; below it {len(below)} processes, "
        f"{len(spawned)} on {python}: {[cmdline(p)[:60] for p in below]}"
    )


def check_models_endpoint(served: Served) -> str:
    """GET /v1/models tells a client the deployed model's rules."""
    body = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{served.port}/v1/models", timeout=10).read())
    text = json.dumps(body)
    assert "Helios-Distilled" in text and '"size_multiple": 64' in text, body
    return text[:200]


def check_prompt_updates(served: Served) -> str:
    """Two prompt updates, one before the first output (held, then forwarded), one later with N=2,
    each reported started/active/completed by the engine's own stream metadata."""
    chunks = 8

    async def body() -> tuple[Transcript, dict[str, Any]]:
        async with ws(served.url) as conn:
            s = Ws(conn)
            start = await s.start("a harbour at dawn", num_frames=chunks * FPC, seed=3)
            assert start["config"]["frames_per_chunk"] == FPC and start["config"]["width"] == W, start
            await s.interact("lanterns", "early", 1)  # the engine has produced nothing yet
            await s.until(lambda m: m.get("event_id") == "early" and m["type"] == "session.interaction.queued")
            first = await media(s)
            assert first["started_event_ids"] == [], first  # held, not lost: it starts at a later boundary
            await s.until(
                lambda m: m["type"] == "video.chunk_metadata" and "early" in m["completed_event_ids"], CHUNK_TIMEOUT * 3
            )
            await s.interact("snow", "late", 2)
            await s.until(
                lambda m: m["type"] == "video.chunk_metadata" and "late" in m["completed_event_ids"], CHUNK_TIMEOUT * 4
            )
            return await finish(s), start

    t, _start = run(body())
    check_stream_rules(t)
    done = t.messages[-1]
    assert done["stopped"] is False and done["unapplied_event_ids"] == [] and done["unfinished_event_ids"] == [], done
    frames = decode(t.video)
    assert frames.shape == (chunks * FPC, H, W, 3), frames.shape
    assert [m["num_frames"] for m in t.media] == [FPC] * chunks
    lists = [
        (m["generation_chunk_index"], m["started_event_ids"], m["active_event_ids"], m["completed_event_ids"])
        for m in t.media
    ]
    early = [m for m in t.media if "early" in m["active_event_ids"]]
    late = [m for m in t.media if "late" in m["active_event_ids"]]
    assert len(early) == 1 and early[0]["generation_chunk_index"] >= 1, lists  # N=1: one chunk, never chunk 0
    assert early[0]["started_event_ids"] == ["early"] and early[0]["transition_progress"] == {"early": 1.0}, lists
    assert [m["transition_progress"]["late"] for m in late] == [0.5, 1.0], lists
    assert late[0]["started_event_ids"] == ["late"] and late[1]["completed_event_ids"] == ["late"], lists
    visible = distance(frames[:FPC], frames[-FPC:])
    return f"{chunks} chunks of {FPC} frames at {W}x{H}; chunk lists (index, started, active, completed): {lists}; " + (
        f"first vs last chunk differ by {visible:.1f}"
    )


def check_image_reference(served: Served) -> str:
    """A start's image_reference reaches the pipeline (Helios: extra_args["image"]): the same seed
    and prompt with and without it give different frames, and without it the same frames twice."""
    plain, _, first = run(one_chunk(served, FPC, prompt="a red barn", seed=7))
    again, _, _ = run(one_chunk(served, FPC, prompt="a red barn", seed=7))
    with_image, begun, _ = run(
        one_chunk(served, FPC, prompt="a red barn", seed=7, image_reference=png_data_url((220, 30, 30), (W, H)))
    )
    assert plain.shape == with_image.shape == (FPC, H, W, 3), (plain.shape, with_image.shape)
    same, changed = distance(plain, again), distance(plain, with_image)
    assert same < 1.0, f"the same seed gave different frames ({same:.2f}): the comparison below means nothing"
    assert changed > 2.0, f"the image changed the frames by {changed:.2f} only: it did not reach the pipeline"
    return (
        f"same seed twice differs by {same:.2f}, with the image by {changed:.2f} (mean |Δ| of 0-255); "
        f"first chunk in {first:.1f} s; config image_reference: {begun['config'].get('image_reference')!r}"
    )


def check_refused_starts(served: Served) -> str:
    """Starts that break a Helios-Distilled rule get invalid_start, naming it, before video.start."""
    seen = []
    for start in (
        {"width": 832, "height": 480},  # the grid: 480 is not a multiple of 64
        {"extra_params": {"pyramid_num_stages": 4}},  # its scheduler has 3 stages
    ):
        answers = run(refused_start(served, start))
        assert is_error("invalid_start")(answers[0]), answers
        assert [a["type"] for a in answers[1:]] == ["session.done"], answers  # no video.start
        seen.append(answers[0]["message"])
    assert "64" in seen[0] and "pyramid_num_stages" in seen[1], seen
    return " | ".join(seen)


def check_refused_interactions(served: Served) -> str:
    """What the engine refuses of an interaction is refused before it is forwarded (so the engine
    never aborts the request): an empty prompt (the proxy: invalid_interaction), a camera event
    (Helios registers only prompt) and a negative_prompt (acked, then interaction_failed); the
    session goes on and its next update still applies."""

    async def body() -> tuple[Transcript, list[dict[str, Any]]]:
        errors = []
        async with ws(served.url) as conn:
            s = Ws(conn)
            await s.start("a field", num_frames=4 * FPC, seed=1)
            await media(s)
            await s.send({"type": "session.interaction", "interaction": {"event_id": "empty", "event": {"prompt": ""}}})
            errors.append(await s.until(lambda m: m["type"] == "error" and m.get("event_id") == "empty"))
            camera = {"camera": {"mode": "velocity", "data": {"translation": [0, 0, 1], "rotation": [0, 0, 0, 1]}}}
            await s.send(
                {
                    "type": "session.interaction",
                    "interaction": {"event_id": "cam", "event": {"multi_modal_data": camera}},
                }
            )
            errors.append(await s.until(lambda m: m["type"] == "error" and m.get("event_id") == "cam"))
            await s.send(
                {
                    "type": "session.interaction",
                    "interaction": {"event_id": "neg", "event": {"prompt": "rain", "negative_prompt": "sun"}},
                }
            )
            errors.append(await s.until(lambda m: m["type"] == "error" and m.get("event_id") == "neg"))
            await s.interact("a meadow", "after", 0)
            await s.until(
                lambda m: m["type"] == "video.chunk_metadata" and "after" in m["completed_event_ids"], CHUNK_TIMEOUT * 3
            )
            return await finish(s), errors

    t, errors = run(body())
    check_stream_rules(t)
    codes = [(e["event_id"], e["code"]) for e in errors]
    assert codes == [("empty", "invalid_interaction"), ("cam", "interaction_failed"), ("neg", "interaction_failed")], (
        errors
    )
    assert "camera" in errors[1]["message"], errors[1]
    done = t.messages[-1]
    assert done["stopped"] is False and len(t.media) == 4, done  # the engine request was never aborted
    return "; ".join(f"{e['event_id']}: {e['code']} ({e['message'][:70]})" for e in errors)


def check_stop(served: Served) -> str:
    """session.stop ends the session at a chunk boundary and the engine request with it."""
    chunks = 8

    async def body() -> Transcript:
        async with ws(served.url) as conn:
            s = Ws(conn)
            await s.start("a road", num_frames=chunks * FPC, seed=2)
            await media(s)
            await s.send({"type": "session.stop"})
            return await finish(s)

    t0 = time.monotonic()
    t = run(body())
    check_stream_rules(t)
    done = t.messages[-1]
    assert done["stopped"] is True and len(t.media) < chunks, (done, len(t.media))
    # the engine is free at once: a new session's first chunk is not behind the stopped one's rest
    _, _, first = run(one_chunk(served, FPC, prompt="a cat", seed=4))
    return f"stopped after {len(t.media)} of {chunks} chunks in {time.monotonic() - t0:.1f} s; next first chunk {first:.1f} s"


def engine_paces() -> bool:
    """Whether this env's engine pauses paced requests itself (vLLM-Omni 0.32's; the adapter
    detects it by its API at load: `rtvideo.backend.vllm_omni.engine.engine_paces`)."""
    release = importlib.metadata.version("vllm-omni")
    return tuple(int(part) for part in release.split(".")[:2]) >= (0, 32)


#: one Helios chunk at the deployment's fps, in ms: 0.32 fails a paced request whose lead cannot
#: hold the next whole chunk ("streaming_buffer_seconds must fit a complete media chunk")
CHUNK_MS = FPC / FPS * 1000


def check_032_client(served: Served) -> str:
    """A client written for vLLM-Omni 0.32 (streaming_pacing, session.playback after each chunk,
    a stop) works unchanged on the real engine: on 0.30 the pacing ask is listed as ignored (0.30
    cannot hold a request back); on 0.32 the engine paces it and its chunks carry `pacing`.
    Reports are never answered, the stop reports its latency."""

    async def body() -> Transcript:
        async with ws(served.url) as conn:
            s = Ws(conn)
            pacing = {"enabled": True, "mode": "client_playhead", "max_lead_ms": round(2.5 * CHUNK_MS)}
            start = await s.start("a road", num_frames=4 * FPC, seed=2, streaming_pacing=pacing)
            played = 0.0
            for _ in range(2):
                played += (await media(s))["num_frames"] / start["config"]["fps"]
                await s.send({"type": "session.playback", "position_seconds": played})
            await s.send({"type": "session.stop"})
            return await finish(s)

    t = run(body())
    check_stream_rules(t)
    config, done = t.messages[0]["config"], t.messages[-1]
    assert not [m for m in t.messages if m["type"] == "error"], t.messages
    assert done["stopped"] is True and done["stop_latency_s"] >= 0, done
    if engine_paces():
        assert config["ignored_fields"] == [], config["ignored_fields"]
        assert all("pacing" in m and "output_chunk_index" in m for m in t.media), t.media
        how = "streaming_pacing honoured by the engine"
    else:
        assert config["ignored_fields"] == ["streaming_pacing"], config["ignored_fields"]
        assert all("pacing" not in m for m in t.media)
        how = "streaming_pacing ignored"
    return f"{how}; {len(t.media)} chunks; stop_latency_s {done['stop_latency_s']:.2f}"


def check_paced_032(served: Served) -> str:
    """vLLM-Omni 0.32's engine pauses a paced request (0.30's cannot: not run there). A player that
    reports each chunk as played gets every chunk, each with the engine's `output_chunk_index`
    (0, 1, 2) and `pacing`; a player that never reports gets one chunk (the lead holds no second),
    then the engine's idle end, `stall_timeout`."""
    if not engine_paces():
        return "not run: this engine (vLLM-Omni < 0.32) has no pacing"
    chunks = 3

    async def played_along() -> Transcript:
        async with ws(served.url) as conn:
            s = Ws(conn)
            pacing = {"max_lead_ms": round(1.5 * CHUNK_MS), "idle_timeout_s": 120}
            await s.start("a road", num_frames=chunks * FPC, seed=2, streaming_pacing=pacing)
            played = 0.0
            for _ in range(chunks):
                played += (await media(s))["num_frames"] / FPS
                await s.send({"type": "session.playback", "position_seconds": played})
            return await finish(s)

    async def never_played() -> Transcript:
        async with ws(served.url) as conn:
            s = Ws(conn)
            pacing = {"max_lead_ms": round(1.5 * CHUNK_MS), "idle_timeout_s": 3}
            await s.start("a road", num_frames=6 * FPC, seed=3, streaming_pacing=pacing)
            return await finish(s)

    t = run(played_along())
    check_stream_rules(t)
    assert t.messages[0]["config"]["ignored_fields"] == [], t.messages[0]["config"]
    assert not [m for m in t.messages if m["type"] == "error"], t.messages
    assert [m["output_chunk_index"] for m in t.media] == list(range(chunks)), t.media
    for m in t.media:
        assert set(m["pacing"]) == {"lead_seconds", "wait_seconds", "retained_bytes"}, m
        assert m["pacing"]["retained_bytes"] > 0 and m["pacing"]["lead_seconds"] <= 1.5 * CHUNK_MS / 1000 + 1e-6, m
    waited = sum(m["pacing"]["wait_seconds"] for m in t.media)
    idle = run(never_played())
    check_stream_rules(idle)
    errors = [m for m in idle.messages if m["type"] == "error"]
    assert [e["code"] for e in errors] == ["stall_timeout"], idle.messages
    assert "Streaming idle timeout" in errors[0]["message"], errors
    assert len(idle.media) == 1, [m.get("output_chunk_index") for m in idle.media]
    return (
        f"{chunks} chunks paced (output_chunk_index 0..{chunks - 1}, waited {waited:.2f} s in all); "
        f"an unplayed session paused after {len(idle.media)} chunk, then stall_timeout"
    )


def check_dropped_client(served: Served) -> str:
    """A client that vanishes (TCP reset, no close) ends its session and aborts its engine request:
    the session count returns to 0 and the next session's first chunk is not late."""
    chunks = 8

    async def body() -> None:
        async with ws(served.url) as conn:
            s = Ws(conn)
            await s.start("a lighthouse", num_frames=chunks * FPC, seed=5)
            await media(s)
            conn.transport.abort()

    run(body())
    t0 = time.monotonic()
    while served.metric("rtvideo_active_sessions") != 0:
        assert time.monotonic() - t0 < CHUNK_TIMEOUT, "the dropped session is still active"
        time.sleep(0.2)
    ended = time.monotonic() - t0
    _, _, baseline = run(one_chunk(served, FPC, prompt="a lighthouse", seed=5))
    ends = served.metric("rtvideo_session_ends_total")
    return (
        f"session ended {ended:.1f} s after the drop; next first chunk {baseline:.1f} s; session ends so far {ends:g}"
    )


CHECKS: list[tuple[str, Callable[[Served], str]]] = [
    ("engine_in_stub", check_engine_in_stub),
    ("models_endpoint", check_models_endpoint),
    ("prompt_updates", check_prompt_updates),
    ("image_reference", check_image_reference),
    ("refused_starts", check_refused_starts),
    ("refused_interactions", check_refused_interactions),
    ("stop", check_stop),
    ("client_032", check_032_client),
    ("paced_032", check_paced_032),
    ("dropped_client", check_dropped_client),
]


def helios(work: Path) -> Deployment:
    return Deployment("helios", write_tiny_helios(work / "tiny-helios"), W, H, FPC)


#: each deployment: how to write it, then its checks (each `serve_ready` first, `serve_stops_clean` last)
SUITES: list[tuple[str, Callable[[Path], Deployment], list[tuple[str, Callable[[Served], str]]]]] = [
    ("helios", helios, CHECKS),
    ("lingbot", lingbot.deployment, lingbot.CHECKS),
]


def run_suite(
    suite: str,
    deploy: Callable[[Path], Deployment],
    chosen: list[tuple[str, Callable[[Served], str]]],
    work: Path,
    record: Callable[[str, Callable[[], str]], bool],
    results: list[tuple[str, bool, str]],
) -> None:
    """One deployment: serve it, run its chosen checks, stop it (whatever happened)."""
    served: list[Served] = []

    def start() -> str:
        served.append(serve(deploy(work), work))
        log = tail(served[0].log, 10**6).splitlines()
        progress = [line for line in log if "waiting for tritonserver" in line]
        return f"ready in {served[0].ready_seconds:.1f} s ({len(progress)} progress lines; last: {progress[-1:]})"

    if not record(f"{suite}.serve_ready", start):  # what could not run counts as failed
        results.extend((name, False, "not run: serve did not start") for name, _ in chosen)
        return
    try:
        for name, check in chosen:
            record(name, lambda check=check: check(served[0]))
    finally:  # whatever happened above (an interrupt too): nothing of it is left running
        record(f"{suite}.serve_stops_clean", lambda: stop(served[0]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", type=Path, help="write the models and logs here and keep them")
    parser.add_argument("--only", action="append", help="run only this check or suite (repeatable)")
    args = parser.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="real-engine-"))
    work.mkdir(parents=True, exist_ok=True)
    results: list[tuple[str, bool, str]] = []

    def record(name: str, fn: Callable[[], str]) -> bool:
        t0 = time.monotonic()
        try:
            detail = fn()
        except (Exception, pytest.fail.Exception) as exc:  # noqa: BLE001 - each failure is reported; the next check runs
            detail = f"{type(exc).__name__}: {exc}"[:2000]
            if not isinstance(exc, AssertionError):
                detail += "\n" + "".join(traceback.format_exception(exc)[-4:])
            results.append((name, False, detail))
            print(f"FAIL {name} ({time.monotonic() - t0:.1f} s): {detail}", flush=True)
            return False
        results.append((name, True, detail))
        print(f"PASS {name} ({time.monotonic() - t0:.1f} s): {detail}", flush=True)
        return True

    for suite, deploy, checks in SUITES:
        chosen = [(f"{suite}.{name}", c) for name, c in checks if not args.only or {suite, name} & set(args.only)]
        if not chosen:
            continue
        run_suite(suite, deploy, chosen, work, record, results)
    failed = [r for r in results if not r[1]]
    if failed:
        print(f"logs: {work} (*-serve.log, *-triton.log)", flush=True)
    elif args.keep is None:
        shutil.rmtree(work, ignore_errors=True)
    print(f"real-engine: {len(results) - len(failed)} passed, {len(failed)} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
