"""Running a ``tritonserver``: spawn, wait for readiness, stop with nothing left behind.

:class:`TritonServer` runs the binary in its own session (process group), polls
``/v2/health/ready`` and, on :meth:`TritonServer.stop`, makes sure neither the server
nor any ``triton_python_backend_stub`` child survives: the stubs outlive a crashed
server, so the whole group is signalled, not just the server's pid.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Optional

from rtvideo.triton.install import TritonInstall, find_tritonserver
from rtvideo.triton.logs import LogTarget, ServerLog

__all__ = ["TritonConfig", "TritonServer", "free_port", "is_ready"]


@dataclass
class TritonConfig:
    """What the server is started with: the repository, its addresses, its verbosity."""

    model_repository: Path
    grpc_port: int = 8001
    http_port: int = 8000
    metrics_port: int = 8002
    host: str = "127.0.0.1"
    log_verbose: int = 0
    extra_args: list[str] = field(default_factory=list)
    # Shutdown grace for in-flight requests; open decoupled streams count as in flight.
    exit_timeout_secs: int = 5


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the usual race applies)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


# No proxies: a loopback health check must not go through $http_proxy.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def is_ready(http_url: str) -> bool:
    """Whether the Triton at ``http_url`` answers ``/v2/health/ready`` with 200 (within 1 s)."""
    return _http_ok(f"{http_url}/v2/health/ready")


def _http_ok(url: str) -> bool:
    try:
        with _OPENER.open(url, timeout=1.0) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


class TritonServer:
    """A ``tritonserver`` process for ``config``; a context manager (start on enter, stop on exit).

    ``stdout``: where the server logs go, a path or an open file (``None``: a temp file).
    The tail of that log is in the ``RuntimeError`` raised when the server dies while starting.
    """

    def __init__(
        self, config: TritonConfig, *, stdout: LogTarget = None, install: Optional[TritonInstall] = None
    ) -> None:
        self.config = config
        self.log = ServerLog(stdout)
        self._install = install
        self._proc: Optional[subprocess.Popen] = None
        self.command: list[str] = []
        self.startup_seconds: Optional[float] = None

    # -- endpoints ---------------------------------------------------------------------------
    @property
    def _url_host(self) -> str:
        host = self.config.host
        if host in ("0.0.0.0", ""):
            host = "127.0.0.1"
        elif host == "::":
            host = "::1"
        return f"[{host}]" if ":" in host else host

    @property
    def grpc_url(self) -> str:
        """``host:port``, as ``tritonclient.grpc`` expects (no scheme)."""
        return f"{self._url_host}:{self.config.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"http://{self._url_host}:{self.config.http_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self._url_host}:{self.config.metrics_port}/metrics"

    # -- process -----------------------------------------------------------------------------
    @property
    def pid(self) -> Optional[int]:
        """Pid of tritonserver; also its process-group id (it leads its own session)."""
        return self._proc.pid if self._proc is not None else None

    def is_alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def process_pids(self) -> list[int]:
        """Live pids of the server's process group: tritonserver and its backend stubs."""
        return _live_group_members(self._proc.pid) if self._proc is not None else []

    # -- log ---------------------------------------------------------------------------------
    @property
    def log_path(self) -> Optional[Path]:
        """The server's log file, once started (``None`` for an open file without a path)."""
        return self.log.path

    def log_tail(self, max_bytes: int = 8000) -> str:
        return self.log.tail(max_bytes)

    def log_errors(self, max_lines: int = 20) -> str:
        """The log's error lines (glog ``E`` lines, failed loads): the cause, above the tables."""
        return self.log.errors(max_lines)

    # -- lifecycle ---------------------------------------------------------------------------
    def build_command(self, install: TritonInstall) -> list[str]:
        """The ``tritonserver`` command line for ``config`` with ``install``'s directories."""
        c = self.config
        cmd = [
            str(install.binary),
            f"--model-repository={Path(c.model_repository).resolve()}",
            "--model-control-mode=none",  # load everything in the repository at start
            "--exit-on-error=true",  # a model that fails to load ends the process: start() reports it
            "--strict-readiness=true",  # ready only when every model is ready
            f"--exit-timeout-secs={c.exit_timeout_secs}",
            "--allow-grpc=true",
            f"--grpc-address={c.host}",
            f"--grpc-port={c.grpc_port}",
            "--allow-http=true",
            f"--http-address={c.host}",
            f"--http-port={c.http_port}",
            "--allow-metrics=true",
            f"--metrics-address={c.host}",
            f"--metrics-port={c.metrics_port}",
            f"--log-verbose={c.log_verbose}",
            # Python-backend shared-memory names are <prefix><model instance>: two servers
            # loading the same model on one host must not share a prefix.
            f"--backend-config=python,shm-region-prefix-name=rtvideo_{os.getpid()}_{secrets.token_hex(4)}_",
        ]
        if install.backend_directory is not None:
            cmd.append(f"--backend-directory={install.backend_directory}")
        if install.cache_directory is not None:
            cmd.append(f"--cache-directory={install.cache_directory}")
        cmd.extend(c.extra_args)
        return cmd

    def start(self, timeout: float = 120.0) -> None:
        """Spawn tritonserver and wait until ``/v2/health/ready`` answers 200.

        On any failure (the server exits, never gets ready, or we are interrupted) the
        server is stopped before the exception propagates: no half-started process stays.
        """
        if self.is_alive():
            raise RuntimeError("tritonserver is already running")
        repo = Path(self.config.model_repository)
        if not repo.is_dir():
            raise FileNotFoundError(f"model repository {repo} does not exist")
        install = self._install or find_tritonserver()
        self._install = install
        self.command = self.build_command(install)
        log_file = self.log.open(temp_prefix=f"rtvideo-tritonserver-{self.config.http_port}-")
        t0 = time.monotonic()
        self._proc = self._spawn(install, log_file)
        try:
            self._wait_ready(t0, timeout)
        except BaseException:
            self.stop()
            raise

    def _spawn(self, install: TritonInstall, log_file: IO) -> subprocess.Popen:
        return subprocess.Popen(
            self.command,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=install.environment(),
            start_new_session=True,  # own process group: stop() can reach the stubs too
        )

    def _wait_ready(self, t0: float, timeout: float) -> None:
        """Poll readiness every 0.1 s until ``t0 + timeout``; an exit ends the wait early."""
        assert self._proc is not None
        ready_url = f"{self.http_url}/v2/health/ready"
        deadline = t0 + timeout
        while True:
            if self._proc.poll() is not None:
                raise self.log.failure(
                    f"tritonserver exited with code {self._proc.returncode} while starting", self.command
                )
            if is_ready(self.http_url):
                self.startup_seconds = time.monotonic() - t0
                return
            if time.monotonic() > deadline:
                raise self.log.failure(f"tritonserver not ready after {timeout:.0f} s ({ready_url})", self.command)
            time.sleep(0.1)

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM tritonserver, wait up to ``timeout``, then SIGKILL its whole process group;
        returns once no process of the group (backend stubs included) is left."""
        proc = self._proc
        if proc is None:
            return
        pgid = proc.pid
        try:
            if proc.poll() is None:
                # Signal only the server first: it unloads the models, which ends the stubs cleanly.
                try:
                    proc.send_signal(signal.SIGTERM)
                    proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    pass
            _kill_group(pgid, grace=2.0)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL cannot be ignored
                pass
        finally:
            self.log.close()

    def __enter__(self) -> "TritonServer":
        self.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()


def _live_group_members(pgid: int) -> list[int]:
    """Pids in process group ``pgid`` that are not zombies (Linux /proc)."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:
            continue
        # Fields after the parenthesised command: state ppid pgrp ...
        rest = stat[stat.rfind(")") + 2 :].split()
        if len(rest) >= 3 and int(rest[2]) == pgid and rest[0] not in ("Z", "X"):
            members.append(int(entry))
    return members


def _kill_group(pgid: int, grace: float) -> None:
    """SIGTERM what is left of the group, then SIGKILL, until nothing live remains."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        if not _live_group_members(pgid):
            return
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not _live_group_members(pgid):
                return
            time.sleep(0.05)
