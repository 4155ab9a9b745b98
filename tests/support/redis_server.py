"""A real `redis-server` for the tests of the session store (issue 39): the test session starts its
own on a free port of 127.0.0.1, with no persistence (`--save "" --appendonly no`) in a temporary
directory, waits until it answers PING, and ends it when the session ends, whatever happened.

scripts/test.sh installs the binary (Debian's `redis-server`). Where it is missing a test that needs
it is skipped on a developer's machine, and fails under CI (the `CI` environment variable set): CI
must not pass without the tests it is there to run. The fixture itself needs no Redis client; the
tests talk to it with `redis.asyncio` (the `redis` extra, part of `test`)."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn

import pytest

from rtvideo.process import launch
from rtvideo.triton.server import free_port

START_SECONDS = 10.0  # a loaded machine answers PING well within this; an idle one in a few ms
STOP_SECONDS = 5.0
#: RESP for PING, and the simple-string answer a ready server gives (a loading one says -LOADING)
_PING, _PONG = b"*1\r\n$4\r\nPING\r\n", b"+PONG\r\n"


def missing() -> NoReturn:
    """No `redis-server` on PATH: fail under CI, skip elsewhere."""
    message = "redis-server is not installed: scripts/test.sh installs it (Debian: apt-get install -y redis-server)"
    if os.environ.get("CI"):
        pytest.fail(f"{message}; CI must run the Redis tests", pytrace=False)
    pytest.skip(message)


def answers_ping(port: int, timeout: float = 0.5) -> bool:
    """Whether the server on 127.0.0.1:`port` answers PING with PONG (a raw RESP exchange)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(_PING)
            return s.recv(64) == _PONG
    except OSError:
        return False


class RedisServer:
    """One `redis-server` process on 127.0.0.1, its data and log in `directory`."""

    def __init__(self, binary: str, directory: Path) -> None:
        self.binary = binary
        self.directory = directory
        self.log = directory / "redis.log"
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, attempts: int = 3) -> None:
        """Start it and wait for its PONG; a port taken between `free_port` and the bind is
        retried on another one."""
        for _ in range(attempts):
            self.port = free_port()
            argv = [
                self.binary,
                "--bind", "127.0.0.1",
                "--port", str(self.port),
                "--save", "",
                "--appendonly", "no",
                "--dir", str(self.directory),
                "--daemonize", "no",
                "--logfile", "",
            ]  # fmt: skip
            with self.log.open("ab") as log:
                # behind the launcher: the server dies with this process, even on its kill -9
                self.proc = subprocess.Popen(
                    launch.command(argv), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
                )
            deadline = time.monotonic() + START_SECONDS
            while time.monotonic() < deadline and self.proc.poll() is None:
                if answers_ping(self.port):
                    return
                time.sleep(0.02)
            self.stop()
        raise RuntimeError(f"redis-server did not answer PING within {START_SECONDS:g} s; its log:\n{self.tail()}")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(STOP_SECONDS)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


@contextlib.contextmanager
def serve_redis(directory: Path, absent: Callable[[], NoReturn] = missing) -> Iterator[RedisServer]:
    """A started server (the body of the `redis_url` fixture), stopped on the way out, an
    exception's included. No `redis-server` on PATH: `absent()` (a test's skip or failure;
    a benchmark's exit)."""
    binary = shutil.which("redis-server")
    if binary is None:
        absent()
    server = RedisServer(binary, directory)
    try:
        server.start()
        yield server
    finally:
        server.stop()
