"""`rtvideo serve` on a tiny model as a subprocess, and the WebSocket session helpers the checks
of scripts/test_real_engine.sh share (tests/real_engine/drive.py, tests/real_engine/lingbot.py)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import os
import select
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rtvideo.triton.server import free_port
from tests.support.processes import alive, descendants
from tests.support.proxy_client import Ws, ws
from tests.support.streams import Transcript, check_stream_rules, decode

FPS = 16
#: a tiny model on 2 cores: a chunk takes seconds; the whole engine start takes minutes
CHUNK_TIMEOUT = 180.0
START_TIMEOUT = 900
MODEL = "realtime_video"


@dataclass
class Served:
    """One `rtvideo serve` subprocess and where to reach it."""

    proc: subprocess.Popen[str]
    port: int
    metrics_port: int
    log: Path
    triton_log: Path
    ready_seconds: float = 0.0
    pids: set[int] = field(default_factory=set)
    stdout_lines: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/realtime/video"

    def metric(self, name: str, label: str = "") -> float:
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5).read().decode()
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith(name + "{") and f'model="{MODEL}"' in line and label in line
        )


@dataclass(frozen=True)
class Deployment:
    """What `rtvideo serve` is started with: the model, its engine arguments and session shape."""

    name: str
    model_dir: Path
    width: int
    height: int
    frames_per_chunk: int
    engine_args: dict[str, Any] = field(default_factory=dict)


def serve(deployment: Deployment, work: Path) -> Served:
    """`rtvideo serve` on a tiny model, as docs/vllm-omni.md's serve commands, until its ready line."""
    port, grpc, http, metrics = (free_port() for _ in range(4))
    log, triton_log = work / f"{deployment.name}-serve.log", work / f"{deployment.name}-triton.log"
    command = [
        sys.executable,
        "-c",
        "import sys; from rtvideo.cli import main; sys.exit(main())",
        "serve",
        "--port",
        str(port),
        "--triton-grpc-port",
        str(grpc),
        "--triton-http-port",
        str(http),
        "--triton-metrics-port",
        str(metrics),
        "--triton-log",
        str(triton_log),
        "--triton-start-timeout",
        str(START_TIMEOUT),
        "--generator",
        "vllm_omni",
        "--vllm-omni-model",
        str(deployment.model_dir),
        "--vllm-omni-engine-args",
        json.dumps({"enforce_eager": True, **deployment.engine_args}),
        "--width",
        str(deployment.width),
        "--height",
        str(deployment.height),
        "--fps",
        str(FPS),
        "--frames-per-chunk",
        str(deployment.frames_per_chunk),
        "--max-sessions",
        "1",
        # a tiny model on a CPU is not real time: its running rate is measured and shown, not refused by
        "--realtime-capacity-fps",
        "off",
        "--pacing-lead",
        "off",
    ]
    env = {**os.environ, "RTVIDEO_REAL_ENGINE_CPU": "1"}
    t0 = time.monotonic()
    with log.open("w") as stderr:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True, env=env, cwd=work)
    served = Served(proc, port, metrics, log, triton_log)
    assert proc.stdout is not None
    # serve prints one line on stdout when ready; vLLM's logger also writes to stdout (in the serve
    # process too: rtvideo.core.event_types imports vllm_omni, which imports vLLM), so read past it
    line, deadline = "", t0 + START_TIMEOUT + 60
    while (
        not line.startswith("rtvideo ready: ") and select.select([proc.stdout], [], [], deadline - time.monotonic())[0]
    ):
        line = proc.stdout.readline()
        if not line:
            break
        served.stdout_lines.append(line)
    served.ready_seconds = time.monotonic() - t0
    served.pids = descendants(proc.pid)
    if not line.startswith("rtvideo ready: "):
        with contextlib.suppress(AssertionError):
            stop(served)  # nothing of it may be left running
        raise AssertionError(f"no ready line ({line!r}); serve's log ends:\n{tail(log)}")
    return served


def stop(served: Served) -> str:
    """SIGTERM as an operator stops it; then nothing of it may be left (the engine's workers included)."""
    pids = served.pids | descendants(served.proc.pid)
    t0 = time.monotonic()
    if served.proc.poll() is None:
        served.proc.send_signal(signal.SIGTERM)
    try:
        code = served.proc.wait(120)
    except subprocess.TimeoutExpired:
        code = None
    deadline = time.monotonic() + 30
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = sorted(p for p in pids if alive(p))
    names = {p: cmdline(p)[:80] for p in left}
    if served.proc.poll() is None:
        served.proc.kill()
    for pid in left:  # never leave them, whatever the check says
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    assert code == 0, f"serve exited {code} on SIGTERM"
    assert not left, f"left running after serve exited: {names}"
    return f"exit 0 in {time.monotonic() - t0:.1f} s, {len(pids)} processes ended"


def tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return "(no log)"


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def ppid(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rfind(")") + 2 :].split()[1])


def exe(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return ""


def run(coro: Coroutine[Any, Any, Any], timeout: float = 900.0) -> Any:
    return asyncio.run(asyncio.wait_for(coro, timeout))


def png_data_url(rgb: tuple[int, int, int], size: tuple[int, int]) -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", size, rgb).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


async def finish(s: Ws) -> Transcript:
    return await s.finish(CHUNK_TIMEOUT * 3)


async def media(s: Ws) -> dict[str, Any]:
    return await s.until(lambda m: m["type"] == "video.chunk_metadata" and m["kind"] == "media", CHUNK_TIMEOUT)


async def one_chunk(served: Served, frames: int, **start: Any) -> tuple[np.ndarray, dict[str, Any], float]:
    """A one-chunk session of `frames`: its decoded frames, its video.start and its time to first chunk."""
    async with ws(served.url) as conn:
        s = Ws(conn)
        t0 = time.monotonic()
        begun = await s.start(num_frames=frames, **start)
        await media(s)
        first = time.monotonic() - t0
        t = await finish(s)
    check_stream_rules(t)
    return decode(t.video), begun, first


async def refused_start(served: Served, start: dict[str, Any]) -> list[dict[str, Any]]:
    """A start's answers up to its session.done (the connection may stay open for another start)."""
    async with ws(served.url) as conn:
        s = Ws(conn)
        await s.send({"type": "session.start", "prompt": "x", **start})
        answers = [await s.next(30)]
        while answers[-1]["type"] != "session.done" and len(answers) < 4:
            answers.append(await s.next(30))
        return answers
