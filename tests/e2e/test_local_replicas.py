"""The local replicas recipe as a user runs it (docs/operations.md "Trying replicas locally"):
`rtvideo replicas` starts one Triton (`rtvideo triton`), two proxies, a redis-server and HAProxy,
every one a real process. A session of the real Python client through HAProxy lives through a
SIGTERM of the proxy that holds it: it resumes through the balancer at the other proxy, under
its request id, its indices once each, an interaction acked before and after. The recipe starts
the stopped proxy again. No secret is on the command line of any process it started but
tritonserver's own (Triton takes its key as a flag: docs/security.md), and after its SIGTERM
nothing it started is left running and its secrets' files are gone."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from rtvideo.client.session import Chunk, RealtimeVideoClient
from rtvideo.process import launch
from rtvideo.replicas import READY_LINE
from tests.support.http_calls import metric_values
from tests.support.processes import RTVIDEO, alive, descendants
from tests.support.proxy_host import run

SIZE = {"width": 128, "height": 96}
READY_SECONDS = 600.0  # a cold Triton and two proxies on a loaded 2-core machine; bounds a hang only
STOP_SECONDS = 180.0
PROXY_LINE = re.compile(r"^replicas: (proxy-\d+) pid (\d+) on ws://127\.0\.0\.1:(\d+)/")


def needed(binary: str) -> None:
    if shutil.which(binary) is None:
        message = f"{binary} is not installed: scripts/test.sh installs it (Debian: apt-get install -y {binary})"
        if os.environ.get("CI"):
            pytest.fail(f"{message}; CI must run this test", pytrace=False)
        pytest.skip(message)


class Recipe:
    """`rtvideo replicas` running in `directory`; its output read as it comes."""

    def __init__(self, directory: Path) -> None:
        needed("redis-server")
        needed("haproxy")
        self.directory = directory
        self.run = directory / "run"
        self.out = directory / "replicas.out"
        argv = [str(RTVIDEO), "replicas", "--port", "0", "--dir", str(self.run), "--max-sessions", "4"]
        argv += ["--", "--max-sessions-per-client", "4"]
        with self.out.open("wb") as out:  # behind the launcher: it dies with the test, even on kill -9
            self.proc = subprocess.Popen(
                launch.command(argv), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
            )
        self.pids: set[int] = set()

    def text(self) -> str:
        return self.out.read_text(errors="replace")

    def logs(self, chars: int = 6000) -> str:
        """Its output and the tail of each proxy's log: what a failure needs to be read."""
        tails = [
            f"--- {p.name}\n{p.read_text(errors='replace')[-chars:]}" for p in sorted(self.run.glob("proxy-*.log"))
        ]
        return "\n".join([self.text(), *tails])

    def wait_for(self, pattern: str, timeout: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while (found := re.search(pattern, self.text(), re.MULTILINE)) is None:
            assert self.proc.poll() is None, f"rtvideo replicas exited:\n{self.text()}"
            assert time.monotonic() < deadline, f"not within {timeout:g} s: {pattern}\n{self.text()}"
            time.sleep(0.2)
        return found

    @property
    def url(self) -> str:
        return self.wait_for(f"^{re.escape(READY_LINE)}(\\S+)", READY_SECONDS).group(1)

    def proxies(self) -> dict[str, tuple[int, int]]:
        """Each proxy's latest pid and its port, from the recipe's lines."""
        found: dict[str, tuple[int, int]] = {}
        for line in self.text().splitlines():
            if m := PROXY_LINE.match(line):
                found[m.group(1)] = (int(m.group(2)), int(m.group(3)))
        return found

    def stop(self) -> int:
        self.pids |= descendants(self.proc.pid)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(STOP_SECONDS)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return -9

    def end(self) -> None:
        """Whatever the test did: nothing of the recipe left."""
        self.pids |= descendants(self.proc.pid)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pid in self.pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def recipe(tmp_path: Path) -> Iterator[Recipe]:
    started = Recipe(tmp_path)
    try:
        yield started
    finally:
        started.end()


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def test_a_session_through_haproxy_lives_through_a_sigterm_of_its_proxy(recipe: Recipe) -> None:
    url = recipe.url
    assert url.startswith("ws://127.0.0.1:") and url.endswith("/v1/realtime/video")
    run_dir = recipe.directory / "run"
    key = (run_dir / "triton.key").read_text().strip()
    store_url = (run_dir / "store.url").read_text().strip()
    password = store_url.split("://:", 1)[1].split("@", 1)[0]
    for path in (run_dir / "triton.key", run_dir / "store.url"):
        assert path.stat().st_mode & 0o077 == 0, path  # the operator's alone
    ready = recipe.wait_for(r"^replicas: triton pid \d+: grpc 127\.0\.0\.1:\d+, metrics port \d+; key in (\S+)$", 5)
    assert ready.group(1) == str(run_dir / "triton.key")  # the key is shown to its operator: where it is

    # No secret on a command line, but tritonserver's own (Triton takes the key as a flag).
    started = descendants(recipe.proc.pid)
    recipe.pids |= started
    lines = {pid: command_line(pid) for pid in started}
    assert not [line for line in lines.values() if password in line]
    assert [line.split()[0].rsplit("/", 1)[-1] for line in lines.values() if key in line] == ["tritonserver"]
    names = " ".join(lines.values())
    assert "haproxy" in names and "redis-server" in names and " serve " in names and " triton " in names

    proxies = recipe.proxies()
    assert sorted(proxies) == ["proxy-0", "proxy-1"], recipe.text()
    canary = "canary-" + os.urandom(8).hex()  # a token in a query: HAProxy's log keeps the path alone
    with urllib.request.urlopen(
        url.replace("ws://", "http://").replace("/v1/realtime/video", f"/readyz?token={canary}")
    ):
        pass

    async def body() -> tuple[RealtimeVideoClient, list[Chunk], dict, str, int]:
        got: list[Chunk] = []
        async with RealtimeVideoClient(url, resume_attempts=8) as client:
            start = await client.start("a harbour at dawn", num_frames=4000, seed=7, **SIZE)

            async def read() -> None:
                async for chunk in client.chunks():
                    got.append(chunk)

            reader = asyncio.ensure_future(read())

            def media_count() -> int:
                return sum(c.metadata["kind"] == "media" for c in got)

            async def until_media(count: int) -> None:
                deadline = time.monotonic() + 120
                while media_count() < count:
                    assert time.monotonic() < deadline and not reader.done(), (client.failure, recipe.logs())
                    await asyncio.sleep(0.05)

            await until_media(3)
            assert (await client.interact("a storm", event_id="before", timeout=20))["event_id"] == "before"
            holding = [
                name
                for name, (_, port) in proxies.items()
                if metric_values(port).get("rtvideo_proxy_sessions_active", 0) > 0
            ]
            assert len(holding) == 1, holding
            pid = proxies[holding[0]][0]
            os.kill(pid, signal.SIGTERM)  # as a deploy stops it: it hands the session off (1012)
            mark = media_count()
            await until_media(mark + 3)  # through HAProxy, at the other proxy
            assert client.resumes >= 1
            assert (await client.interact("a calm sea", event_id="after", timeout=20))["event_id"] == "after"
            await client.stop()
            await asyncio.wait_for(reader, 60)
        return client, got, start, holding[0], pid

    client, got, start, stopped, old_pid = run(body(), timeout=420)
    assert client.failure is None and client.errors.empty(), (client.failure, recipe.logs())
    assert client.done is not None and client.done["request_id"] == start["request_id"]
    assert {c.metadata["request_id"] for c in got} == {start["request_id"]}
    indices = [c.metadata["transport_chunk_index"] for c in got]
    assert indices == list(range(len(indices))), indices  # every chunk once, in order

    # The recipe started the stopped proxy again, on its port, as a Deployment would.
    deadline = time.monotonic() + READY_SECONDS
    while recipe.proxies()[stopped][0] == old_pid:
        assert time.monotonic() < deadline and recipe.proc.poll() is None, recipe.text()
        time.sleep(0.2)
    assert recipe.proxies()[stopped][1] == proxies[stopped][1]
    assert f"{stopped} exited with code 0; starting it again" in recipe.text()

    assert recipe.stop() == 0, recipe.text()
    left = [pid for pid in recipe.pids | descendants(recipe.proc.pid) if alive(pid)]
    assert not left, [command_line(pid) for pid in left]
    assert not (run_dir / "triton.key").exists() and not (run_dir / "store.url").exists()
    assert "replicas: stopped" in recipe.text()
    balancer_log = (run_dir / "haproxy.log").read_text()
    assert "GET /readyz HTTP/1.1" in balancer_log and canary not in balancer_log
