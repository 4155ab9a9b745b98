"""Running a ``tritonserver``: spawn, wait for readiness, stop with nothing left behind.

:class:`TritonServer` runs the binary in its own session (process group), polls
readiness over gRPC and, on :meth:`TritonServer.stop`, makes sure neither the server
nor any ``triton_python_backend_stub`` child survives: the stubs outlive a crashed
server, so the whole group is signalled, not just the server's pid.

Nothing is left behind when the launcher itself dies either (even by ``kill -9``): on
Linux the server gets ``SIGKILL`` when the thread that spawned it ends
(``PR_SET_PDEATHSIG``), so spawn from a thread that lives as long as the server (the
main thread). Its stubs then notice that their parent is gone (each stub polls
``kill(parent, 0)`` every 0.3 s; init reaps the orphaned server) and exit.
Their shared-memory files (``/dev/shm/rtvideo_<launcher pid>_<hex>_*``) are removed on
:meth:`~TritonServer.stop`, and those of launchers that no longer run at the next start.

Triton's HTTP endpoint is off unless ``TritonConfig.http`` asks for it: it accepts
unauthenticated ``text/plain`` POSTs, which any web page can send to a loopback port.

With ``TritonConfig.key`` set, every protocol group but health (inference, shared memory,
model config and repository, statistics, trace, logging, metadata) answers only calls that
carry the key (:mod:`rtvideo.triton.access`; :meth:`TritonServer.client_headers`); the
readiness wait here uses health, which stays open.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rtvideo.process import launch, shm
from rtvideo.triton import access
from rtvideo.triton.command import StubEnvironment, TritonConfig, server_command, shown_command
from rtvideo.triton.install import TritonInstall, find_tritonserver
from rtvideo.triton.logs import LogTarget, ServerLog
from rtvideo.triton.shm_files import SHM_DIR, clean_stale_shm, remove_shm_files, shm_prefix_of

__all__ = ["FIXED_RELEASE", "TritonServer", "free_port", "is_affected", "is_ready", "trace_args"]

log = logging.getLogger(__name__)


def trace_args(url: str | None) -> list[str]:
    """Triton's own OpenTelemetry tracing of every request, exported over OTLP/HTTP to `url`
    (``HOST:PORT/v1/traces``; docs/operations.md "Traces"); none when `url` is None."""
    if url is None:
        return []
    settings = ["mode=opentelemetry", "level=TIMESTAMPS", "rate=1", f"opentelemetry,url={url}"]
    return [f"--trace-config={setting}" for setting in [*settings, "opentelemetry,resource=service.name=triton"]]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the usual race applies)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def is_ready(grpc_url: str, timeout: float = 1.0) -> bool:
    """Whether the Triton at ``grpc_url`` (``host:port``) says it is ready, over gRPC (within ``timeout``)."""
    import tritonclient.grpc as grpcclient  # imported when needed: health is open, no key needed

    try:
        client = grpcclient.InferenceServerClient(grpc_url)
    except Exception:  # noqa: BLE001 - a bad address is "not ready"
        return False
    try:
        return bool(client.is_server_ready(client_timeout=timeout))
    except Exception:  # noqa: BLE001 - unreachable, refused, timed out
        return False
    finally:
        client.close()


#: the first Triton release without the Python backend's shared-memory CVEs (CVE-2025-23319,
#: CVE-2025-23320, CVE-2025-23334): NGC 25.07 per NVIDIA's bulletin, whose server reports 2.59.1
#: (NGC 25.06 is 2.59.0). nvidia-pytriton 0.7.0 brings 2.51.0 (NGC 24.10).
FIXED_RELEASE = (2, 59, 1)


def is_affected(version: str) -> bool:
    """Whether a Triton server version ("2.51.0", as its metadata says) predates FIXED_RELEASE;
    a version that cannot be read counts as affected."""
    parts = re.findall(r"\d+", version)[:3]
    if not parts:
        return True
    numbers = tuple(int(p) for p in parts)
    return numbers + (0,) * (3 - len(numbers)) < FIXED_RELEASE


class TritonServer:
    """A ``tritonserver`` process for ``config``; a context manager (start on enter, stop on exit).

    ``stdout``: where the server logs go, a path or an open file (``None``: a temp file; ``"-"``:
    this process's standard error, with a bounded tail kept in memory).
    The tail of that log is in the ``RuntimeError`` raised when the server dies while starting.
    """

    def __init__(self, config: TritonConfig, *, stdout: LogTarget = None, install: TritonInstall | None = None) -> None:
        self.config = config
        self.log = ServerLog(stdout)  # `log.path`: the server's log file, once started
        self._install = install
        self._proc: subprocess.Popen | None = None
        self.command: list[str] = []
        self.startup_seconds: float | None = None
        #: prefix of the Python backend's shared-memory names for the current run
        self.shm_prefix: str | None = None
        self._spawned_at = 0.0
        self._env = StubEnvironment()  # the server's environment and its stubs' BASH_ENV file

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
    def metrics_url(self) -> str:
        return f"http://{self._url_host}:{self.config.metrics_port}/metrics"

    def client_headers(self) -> dict[str, str]:
        """The gRPC metadata every call to this server needs (its key's header; {} without one)."""
        return access.key_headers(self.config.key)

    def server_version(self, timeout: float = 5.0) -> str | None:
        """The running server's version from its metadata ("2.51.0"), None when it does not answer."""
        import tritonclient.grpc as grpcclient

        try:
            client = grpcclient.InferenceServerClient(self.grpc_url)
        except Exception:  # noqa: BLE001 - a bad address: no version
            return None
        try:
            metadata = client.get_server_metadata(headers=self.client_headers(), client_timeout=timeout)
            return str(metadata.version) or None
        except Exception:  # noqa: BLE001 - unreachable, refused, timed out
            return None
        finally:
            client.close()

    # -- process -----------------------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        """Pid of tritonserver; also its process-group id (it leads its own session)."""
        return self._proc.pid if self._proc is not None else None

    def is_alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def exit_code(self) -> int | None:
        """How the last run ended (``-6``: aborted by SIGABRT); None while it runs or before a spawn."""
        return self._proc.poll() if self._proc is not None else None

    def process_pids(self) -> list[int]:
        """Live pids of the server's process group: tritonserver and its backend stubs."""
        return _live_group_members(self._proc.pid) if self._proc is not None else []

    # -- lifecycle ---------------------------------------------------------------------------
    def build_command(self, install: TritonInstall) -> list[str]:
        """The ``tritonserver`` command line for ``config`` with ``install``'s directories
        (and a new shared-memory prefix, ``shm_prefix``)."""
        # Python-backend shared-memory names are <prefix><uuid>: two servers on one host must not
        # share a prefix, and the launcher's pid in it lets a later start clean up after a crash.
        self.shm_prefix = f"{shm_prefix_of(os.getpid())}{secrets.token_hex(4)}_"
        return server_command(self.config, install, self.shm_prefix)

    @property
    def shown_command(self) -> list[str]:
        """``command`` as it may be shown (in an error, a log): the key replaced by ``<key>``."""
        return shown_command(self.command, self.config.key)

    def start(self, timeout: float = 120.0, progress: Callable[[float, str], None] | None = None) -> None:
        """Spawn tritonserver and wait until it is ready (:meth:`spawn`, then :meth:`wait_ready`).

        On any failure (the server exits, never gets ready, or we are interrupted) the
        server is stopped before the exception propagates: no half-started process stays.
        """
        self.spawn()
        self.wait_ready(timeout, progress)

    def spawn(self) -> None:
        """Start the process and return at once. Call it from a thread that lives as long as
        the server (the main thread): on Linux the server is killed when that thread ends."""
        if self.is_alive():
            raise RuntimeError("tritonserver is already running")
        repo = Path(self.config.model_repository)
        if not repo.is_dir():
            raise FileNotFoundError(f"model repository {repo} does not exist")
        clean_stale_shm()
        install = self._install or find_tritonserver()
        self._install = install
        self.command = self.build_command(install)
        log_file = self.log.open(temp_prefix=f"rtvideo-tritonserver-{self.config.grpc_port}-")
        self.startup_seconds = None
        self._spawned_at = time.monotonic()
        if threading.current_thread() is not threading.main_thread():
            log.debug(
                "tritonserver spawned from thread %s: it dies when that thread ends", threading.current_thread().name
            )
        env = self._env.build(install, self.config)
        try:
            self._proc = subprocess.Popen(
                launch.command(self.command),  # dies with its launcher, even on kill -9
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # own process group: stop() can reach the stubs too
                umask=0o077,  # what it and its stubs create is their user's alone (shm: see wait_ready)
            )
        except BaseException:
            self.log.close()
            self._env.remove()
            raise
        self.log.spawned()

    def model_states(self) -> str:
        """The models' load states as Triton reports them (`name: STATE`, comma-separated), or
        why they could not be read; for progress lines while a large model loads."""
        import tritonclient.grpc as grpcclient

        try:
            client = grpcclient.InferenceServerClient(self.grpc_url)
        except Exception as exc:  # noqa: BLE001 - reported in the progress line
            return f"unreadable ({exc})"
        try:
            index = client.get_model_repository_index(
                headers=access.key_headers(self.config.key), as_json=True, client_timeout=2.0
            )
            models = index.get("models", [])
            return ", ".join(f"{m.get('name')}: {m.get('state') or 'UNKNOWN'}" for m in models) or "none yet"
        except Exception:  # noqa: BLE001 - not listening yet
            return "server not answering yet"
        finally:
            client.close()

    def wait_ready(
        self, timeout: float = 120.0, progress: Callable[[float, str], None] | None = None, every: float = 15.0
    ) -> None:
        """Poll gRPC readiness every 0.1 s until ``timeout`` s after the spawn; an exit ends the
        wait early. Every ``every`` s, ``progress(elapsed, model_states)`` is called, so that a
        long load (a 14B model's weights) is shown, not a silent wait. On failure the server is
        stopped before the exception propagates."""
        proc = self._proc
        if proc is None:
            raise RuntimeError("tritonserver was not spawned")
        deadline = self._spawned_at + timeout
        next_progress = self._spawned_at + every
        try:
            while True:
                if proc.poll() is not None:
                    raise self.log.failure(
                        f"tritonserver exited with code {proc.returncode} while starting", self.shown_command
                    )
                self.restrict_shm()  # as soon as a stub's region appears
                if is_ready(self.grpc_url, timeout=1.0):
                    self.startup_seconds = time.monotonic() - self._spawned_at
                    self.restrict_shm()
                    return
                now = time.monotonic()
                if now > deadline:
                    raise self.log.failure(
                        f"tritonserver not ready after {timeout:.0f} s (gRPC {self.grpc_url}; raise "
                        "--triton-start-timeout for a model whose weights load slowly)",
                        self.shown_command,
                    )
                if progress is not None and now >= next_progress:
                    next_progress = now + every
                    progress(now - self._spawned_at, self.model_states())
                time.sleep(0.1)
        except BaseException:
            self.stop()
            raise

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM tritonserver, wait up to ``timeout`` (0: not at all), then SIGKILL its whole
        process group; returns once no process of the group (backend stubs included) is left,
        and its shared-memory files are removed."""
        proc = self._proc
        if proc is None:
            self._env.remove()
            return
        pgid = proc.pid
        try:
            if proc.poll() is None and timeout > 0:
                # Signal only the server first: it unloads the models, which ends the stubs cleanly.
                try:
                    proc.send_signal(signal.SIGTERM)
                    proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    pass
            _kill_group(pgid, grace=2.0 if timeout > 0 else 0.0)
            with contextlib.suppress(subprocess.TimeoutExpired):  # pragma: no cover - SIGKILL cannot be ignored
                proc.wait(timeout=5)
        finally:
            self.log.close()
            self.remove_shm()
            self._env.remove()

    def restrict_shm(self) -> list[str]:
        """Make this run's shared-memory files readable by their owner only (the stubs create them
        0644 whatever the umask: rtvideo.process.shm); returns the names changed."""
        return shm.restrict_prefix(self.shm_prefix) if self.shm_prefix else []

    def remove_shm(self) -> list[str]:
        """Remove this run's shared-memory files (a stub killed hard leaves them); returns their names."""
        if self.shm_prefix is None:
            return []
        try:
            names = [n for n in os.listdir(SHM_DIR) if n.startswith(self.shm_prefix)]
        except OSError:
            return []
        return remove_shm_files(names)

    def __enter__(self) -> TritonServer:
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
    """SIGTERM what is left of the group (skipped when ``grace`` is 0), then SIGKILL, until
    nothing live remains."""
    steps = ((signal.SIGTERM, grace),) if grace > 0 else ()
    for sig, wait in (*steps, (signal.SIGKILL, 5.0)):
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
