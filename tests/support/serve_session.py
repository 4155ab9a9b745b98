"""One session through `rtvideo serve` run as a subprocess: the ready line, a session decoded,
SIGTERM, nothing left (run from the checkout and from an installed wheel)."""

from __future__ import annotations

import asyncio
import select
import signal
import subprocess
import time
from pathlib import Path

from rtvideo.client.session import RealtimeVideoClient
from rtvideo.triton import free_port
from tests.support.processes import alive, descendants, end_all
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
