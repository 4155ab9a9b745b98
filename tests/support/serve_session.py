"""`rtvideo serve` run as a subprocess by the tests: `launch` (started on free ports), `serve`
(ready, with its URL and health), its processes (`triton_pids`), and `serve_one_session` (one
session decoded, SIGTERM, nothing left)."""

from __future__ import annotations

import asyncio
import json
import select
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from rtvideo.client.session import RealtimeVideoClient
from rtvideo.triton.server import free_port
from tests.support.processes import RTVIDEO, alive, descendants, end_all, stop_serve
from tests.support.streams import decode


@dataclass
class Served:
    """A started `rtvideo serve`: its process (stdout piped, as text), its ports and its log."""

    proc: subprocess.Popen
    port: int
    grpc_port: int | None  # its own Triton's (None with --triton-url)
    log: Path

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/realtime/video"

    def get(self, path: str) -> tuple[int, dict]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=10) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())

    def tail(self) -> str:
        return self.log.read_text()[-4000:]

    def ready_line(self, timeout: float = 300) -> str:
        """Its one line on stdout once ready ("" when none came within `timeout`, or it died)."""
        assert self.proc.stdout is not None
        return self.proc.stdout.readline() if select.select([self.proc.stdout], [], [], timeout)[0] else ""

    def children(self) -> set[int]:
        return descendants(self.proc.pid)


def launch(
    tmp: Path,
    *extra: str,
    rtvideo: Path = RTVIDEO,
    own_triton: bool = True,
    triton_log: str | None = None,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> Served:
    """`rtvideo serve` started as a subprocess on free ports (its own Triton's gRPC and metrics
    ports too, unless `own_triton` is off: `extra` then names --triton-url), Triton's log in
    `tmp` unless `triton_log` says where, standard error to `tmp`/serve.log. Returns at once:
    `Served.ready_line` waits for it."""
    port = free_port()
    args = ["--port", str(port)]
    grpc_port = None
    if own_triton:
        grpc_port = free_port()
        args += ["--triton-grpc-port", str(grpc_port), "--triton-metrics-port", str(free_port())]
        args += ["--triton-log", triton_log or str(tmp / "triton.log")]
    log = tmp / "serve.log"
    with log.open("wb") as stderr:
        proc = subprocess.Popen(
            [str(rtvideo), "serve", *args, *extra], stdout=subprocess.PIPE, stderr=stderr, text=True, env=env, cwd=cwd
        )
    return Served(proc, port, grpc_port, log)


def serve(tmp: Path, *extra: str) -> Served:
    """`rtvideo serve` as a subprocess, once it printed its ready line (fails the test otherwise)."""
    served = launch(tmp, *extra)
    if not served.ready_line().startswith("rtvideo ready:"):
        stop_serve(served.proc)
        pytest.fail("rtvideo serve did not get ready:\n" + served.tail())
    return served


def serve_one_session(rtvideo: Path, tmp_path: Path, cwd: Path | None = None) -> None:
    """`rtvideo serve` as a subprocess: the ready line, one session decoded, SIGTERM, nothing left."""
    served = launch(tmp_path, "--pacing-lead", "off", "--frames-per-chunk", "6", rtvideo=rtvideo, cwd=cwd)
    proc = served.proc
    children: set[int] = set()
    try:
        line = served.ready_line()
        assert line == f"rtvideo ready: {served.url} (triton grpc 127.0.0.1:{served.grpc_port})\n", line + served.tail()
        children = served.children()
        assert any("tritonserver" in cmdline(p) for p in children)

        async def session() -> tuple[dict, dict | None]:
            async with RealtimeVideoClient(served.url) as c:
                start = await c.start("a lighthouse in fog", num_frames=18, seed=1)
                return start, await c.save_mp4(tmp_path / "out.mp4")

        start, done = asyncio.run(asyncio.wait_for(session(), 60))
        assert start["config"]["frames_per_chunk"] == 6  # the override reached the model
        assert done is not None and done["chunks"] == 4  # three media chunks and the trailer
        assert decode((tmp_path / "out.mp4").read_bytes()).shape[0] == 18

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        deadline = time.monotonic() + 30
        while any(alive(p) for p in children):
            assert time.monotonic() < deadline, f"left behind: {[p for p in children if alive(p)]}"
            time.sleep(0.1)
        assert proc.stdout is not None and proc.stdout.read() == ""  # exactly one line on stdout
    finally:
        end_all(proc, children)


def cmdline(pid: int) -> str:
    """A process's command line, space-separated ("" once it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def triton_pids(served_pid: int) -> tuple[int, list[int]]:
    """tritonserver (a child of `rtvideo serve`) and its Python-backend stubs (its children)."""
    pids = descendants(served_pid)
    server = next(p for p in pids if "tritonserver" in cmdline(p) and "stub" not in cmdline(p))
    return server, [p for p in descendants(server) if "triton_python_backend_stub" in cmdline(p)]
