"""`rtvideo serve` run as a subprocess by the tests: `serve` (ready, with its URL and health), its
processes (`triton_pids`), and `serve_one_session` (one session decoded, SIGTERM, nothing left)."""

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
from rtvideo.triton import free_port
from tests.support.processes import RTVIDEO, alive, descendants, end_all, stop_serve
from tests.support.streams import decode


def serve_one_session(rtvideo: Path, tmp_path: Path, cwd: Path | None = None) -> None:
    """`rtvideo serve` as a subprocess: the ready line, one session decoded, SIGTERM, nothing left."""
    ports = [free_port() for _ in range(4)]
    log = tmp_path / "serve.log"
    with log.open("wb") as stderr:
        proc = subprocess.Popen(
            [
                str(rtvideo),
                "serve",
                "--port",
                str(ports[0]),
                "--triton-grpc-port",
                str(ports[1]),
                "--triton-http-port",
                str(ports[2]),
                "--triton-metrics-port",
                str(ports[3]),
                "--triton-log",
                str(tmp_path / "triton.log"),
                "--pacing-lead",
                "off",
                "--frames-per-chunk",
                "6",
            ],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            cwd=cwd,
        )
    children: set[int] = set()
    try:
        assert proc.stdout is not None
        assert select.select([proc.stdout], [], [], 300)[0], "no ready line in 300 s:\n" + log.read_text()[-3000:]
        line = proc.stdout.readline()  # the ready line, or "" when the process died
        url = f"ws://127.0.0.1:{ports[0]}/v1/realtime/video"
        assert line == f"rtvideo ready: {url} (triton grpc 127.0.0.1:{ports[1]})\n", line + log.read_text()[-3000:]
        children = descendants(proc.pid)
        assert any("tritonserver" in Path(f"/proc/{p}/cmdline").read_text() for p in children)

        async def session() -> tuple[dict, dict | None]:
            async with RealtimeVideoClient(url) as c:
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
        assert proc.stdout.read() == ""  # exactly one line on stdout
    finally:
        end_all(proc, children)


@dataclass
class Served:
    proc: subprocess.Popen
    port: int
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


def serve(tmp: Path, *extra: str) -> Served:
    """`rtvideo serve` as a subprocess, once it printed its ready line (fails the test otherwise)."""
    ports = [free_port() for _ in range(3)]
    log = tmp / "serve.log"
    with log.open("wb") as stderr:
        proc = subprocess.Popen(
            [
                str(RTVIDEO),
                "serve",
                "--port",
                str(ports[0]),
                "--triton-grpc-port",
                str(ports[1]),
                "--triton-metrics-port",
                str(ports[2]),
                "--triton-log",
                str(tmp / "triton.log"),
                *extra,
            ],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
    served = Served(proc, ports[0], log)
    assert proc.stdout is not None
    ready = select.select([proc.stdout], [], [], 300)[0]
    line = proc.stdout.readline() if ready else ""
    if not line.startswith("rtvideo ready:"):
        stop_serve(proc)
        pytest.fail("rtvideo serve did not get ready:\n" + served.tail())
    return served


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
