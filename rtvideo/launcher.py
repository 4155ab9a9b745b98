"""Start and stop a local ``tritonserver`` for the model repository.

Where the binary comes from (:func:`find_tritonserver`):

1. ``$TRITONSERVER``: path of a ``tritonserver`` binary;
2. ``tritonserver`` on ``PATH`` (the NGC container: backends live in
   ``/opt/tritonserver/backends``, nothing to prepare);
3. the ``nvidia-pytriton`` wheel (``pip install rtvideo[server]``), whose
   Python backend needs the stub that matches the running interpreter. The wheel
   is never modified: a backend directory is assembled in a cache directory.

:class:`TritonServer` runs the binary in its own session (process group), waits
for ``/v2/health/ready`` and, on :meth:`TritonServer.stop`, makes sure neither
the server nor any ``triton_python_backend_stub`` child survives.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.error
import urllib.request
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Optional, Union

__all__ = [
    "TritonConfig",
    "TritonInstall",
    "TritonServer",
    "find_tritonserver",
    "free_port",
]

_STUB_NAME = "triton_python_backend_stub"
_ERROR_LINE = re.compile(r"^E\d{4} ")  # glog severity E, e.g. "E1130 08:56:23.459087 ..."


@dataclass
class TritonConfig:
    model_repository: Path
    grpc_port: int = 8001
    http_port: int = 8000
    metrics_port: int = 8002
    host: str = "127.0.0.1"
    log_verbose: int = 0
    extra_args: list[str] = field(default_factory=list)
    # Shutdown grace for in-flight requests; open decoupled streams count as in flight.
    exit_timeout_secs: int = 5


@dataclass
class TritonInstall:
    """A runnable ``tritonserver`` and what it needs around it."""

    binary: Path
    kind: str  # "env" ($TRITONSERVER), "path" (on PATH) or "wheel" (nvidia-pytriton)
    backend_directory: Optional[Path] = None  # None: the binary's default (/opt/tritonserver/backends)
    cache_directory: Optional[Path] = None
    library_dirs: list[Path] = field(default_factory=list)  # prepended to LD_LIBRARY_PATH

    def environment(self, base: Optional[dict[str, str]] = None) -> dict[str, str]:
        """Environment for the server and the Python-backend stubs it spawns."""
        env = dict(os.environ if base is None else base)
        lib_dirs = [str(d) for d in _interpreter_library_dirs() + list(self.library_dirs)]
        if env.get("LD_LIBRARY_PATH"):
            lib_dirs.append(env["LD_LIBRARY_PATH"])
        env["LD_LIBRARY_PATH"] = os.pathsep.join(_dedupe(lib_dirs))
        # The stub's embedded Python finds its prefix through PATH: venv bin first
        # makes it import the venv's packages (numpy, torch, rtvideo, ...).
        # sys.executable is deliberately not resolved: the venv's bin is the point.
        path = [os.path.dirname(sys.executable)]
        if env.get("PATH"):
            path.append(env["PATH"])
        env["PATH"] = os.pathsep.join(_dedupe(path))
        return env


def _dedupe(items: list[str]) -> list[str]:
    seen: set[str] = set()
    out = []
    for item in items:
        if item and item not in seen:
            seen.add(item)
            out.append(item)
    return out


def _interpreter_library_dirs() -> list[Path]:
    # The stub links libpython3.X.so; take the running interpreter's before any system copy.
    libdir = sysconfig.get_config_var("LIBDIR")
    return [Path(libdir)] if libdir else []


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the usual race applies)."""
    import socket

    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def find_tritonserver() -> TritonInstall:
    """Locate ``tritonserver``: ``$TRITONSERVER``, else ``PATH``, else the nvidia-pytriton wheel."""
    env_value = os.environ.get("TRITONSERVER")
    if env_value:
        binary = Path(env_value).expanduser()
        if not binary.is_file() or not os.access(binary, os.X_OK):
            raise FileNotFoundError(
                f"TRITONSERVER={env_value!r} does not name an executable tritonserver binary; "
                "fix or unset $TRITONSERVER to use tritonserver on PATH or the nvidia-pytriton wheel"
            )
        binary = binary.resolve()
        wheel_root = binary.parent.parent
        if (wheel_root / "python_backend_stubs").is_dir():
            return _wheel_install(wheel_root, binary=binary, kind="env")
        backends = wheel_root / "backends"
        return TritonInstall(
            binary=binary, kind="env", backend_directory=backends if backends.is_dir() else None
        )

    on_path = shutil.which("tritonserver")
    if on_path:
        return TritonInstall(binary=Path(on_path), kind="path")

    wheel_root = _pytriton_server_dir()
    if wheel_root is None:
        raise FileNotFoundError(
            "no tritonserver found: set $TRITONSERVER, put tritonserver on PATH (NGC container), "
            "or install the wheel with `pip install 'rtvideo[server]'` (nvidia-pytriton)"
        )
    return _wheel_install(wheel_root, binary=wheel_root / "bin" / "tritonserver", kind="wheel")


def _pytriton_server_dir() -> Optional[Path]:
    import importlib.util

    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / "tritonserver"
        if (candidate / "bin" / "tritonserver").is_file():
            return candidate
    return None


def _wheel_install(wheel_root: Path, *, binary: Path, kind: str) -> TritonInstall:
    """Wheel layout: ``<root>/{bin,backends,caches,python_backend_stubs/3.X}``, libs in
    ``<site-packages>/nvidia_pytriton.libs`` (reached by relative RPATHs only)."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = wheel_root / "python_backend_stubs" / version / _STUB_NAME
    if not stub.is_file():
        available = sorted(p.name for p in (wheel_root / "python_backend_stubs").iterdir())
        raise FileNotFoundError(
            f"the nvidia-pytriton wheel at {wheel_root} has no Python-backend stub for Python "
            f"{version} (it has: {', '.join(available)})"
        )
    _warn_if_numpy2()
    library_dirs = [
        d
        for d in (wheel_root.parent.parent / "nvidia_pytriton.libs", wheel_root / "external_libs")
        if d.is_dir()
    ]
    caches = wheel_root / "caches"
    return TritonInstall(
        binary=binary,
        kind=kind,
        backend_directory=_prepare_backend_directory(wheel_root, stub, version),
        cache_directory=caches if caches.is_dir() else None,
        library_dirs=library_dirs,
    )


def _warn_if_numpy2() -> None:
    from importlib import metadata

    try:
        major = int(metadata.version("numpy").split(".")[0])
    except (metadata.PackageNotFoundError, ValueError):
        return
    if major >= 2:
        warnings.warn(
            "numpy>=2 with the nvidia-pytriton stub: BYTES tensors decode as garbage; install numpy<2",
            RuntimeWarning,
            stacklevel=3,
        )


def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    root = Path(base) / "rtvideo"
    try:
        root.mkdir(parents=True, exist_ok=True)
        if os.access(root, os.W_OK):
            return root
    except OSError:
        pass
    root = Path(tempfile.gettempdir()) / f"rtvideo-{os.getuid()}"
    root.mkdir(parents=True, exist_ok=True)
    return root


def _prepare_backend_directory(wheel_root: Path, stub: Path, version: str) -> Path:
    """``<cache>/triton-backends-<hash>/``: the wheel's backends as symlinks, with the stub
    for this interpreter in ``python/``. Built in a temp dir and renamed into place, so
    concurrent launchers never see a half-built directory."""
    st = stub.stat()
    key = f"{wheel_root.resolve()}|{version}|{st.st_size}|{st.st_mtime_ns}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    root = _cache_root()
    target = root / f"triton-backends-{digest}"
    if _backend_directory_ok(target):
        return target
    if target.exists() or target.is_symlink():
        shutil.rmtree(target, ignore_errors=True)  # stale (the wheel moved or was reinstalled)

    staging = Path(tempfile.mkdtemp(prefix=".triton-backends-", dir=root))
    os.chmod(staging, 0o755)  # mkdtemp makes it 0700
    try:
        for backend in sorted((wheel_root / "backends").iterdir()):
            if backend.name == "python":
                continue
            os.symlink(backend.resolve(), staging / backend.name)
        python_dir = staging / "python"
        python_dir.mkdir()
        for item in sorted((wheel_root / "backends" / "python").iterdir()):
            if item.name in ("__pycache__", _STUB_NAME):
                continue
            os.symlink(item.resolve(), python_dir / item.name)
        # A symlink keeps the stub's $ORIGIN-relative RPATH valid (the kernel resolves it).
        os.symlink(stub.resolve(), python_dir / _STUB_NAME)
        try:
            os.rename(staging, target)
        except OSError:
            if not _backend_directory_ok(target):  # lost a race to a broken copy: surface it
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _backend_directory_ok(target: Path) -> bool:
    python_dir = target / "python"
    return (python_dir / _STUB_NAME).is_file() and (python_dir / "libtriton_python.so").is_file()


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


StdoutTarget = Union[str, "os.PathLike[str]", IO, None]


class TritonServer:
    """A ``tritonserver`` process for ``config``; a context manager (start on enter, stop on exit).

    ``stdout``: where the server logs go, a path or an open file (``None``: a temp file).
    The tail of that log is in the ``RuntimeError`` raised when the server dies while starting.
    """

    def __init__(self, config: TritonConfig, *, stdout: StdoutTarget = None, install: Optional[TritonInstall] = None):
        self.config = config
        self._stdout_target = stdout
        self._install = install
        self._proc: Optional[subprocess.Popen] = None
        self._log_file: Optional[IO] = None
        self._owns_log_file = False
        self.log_path: Optional[Path] = None
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

    @property
    def pid(self) -> Optional[int]:
        """Pid of tritonserver; also its process-group id (it leads its own session)."""
        return self._proc.pid if self._proc is not None else None

    def is_alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def process_pids(self) -> list[int]:
        """Live pids of the server's process group: tritonserver and its backend stubs."""
        return _live_group_members(self._proc.pid) if self._proc is not None else []

    # -- lifecycle ---------------------------------------------------------------------------
    def build_command(self, install: TritonInstall) -> list[str]:
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

    def _open_log(self) -> IO:
        target = self._stdout_target
        if target is None:
            fd, name = tempfile.mkstemp(prefix=f"rtvideo-tritonserver-{self.config.http_port}-", suffix=".log")
            self.log_path = Path(name)
            self._owns_log_file = True
            return os.fdopen(fd, "ab")
        if isinstance(target, (str, os.PathLike)):
            self.log_path = Path(target)
            self._owns_log_file = True
            return open(self.log_path, "ab")
        name = getattr(target, "name", None)
        if isinstance(name, str) and os.path.isfile(name):
            self.log_path = Path(name)
        return target

    def log_tail(self, max_bytes: int = 8000) -> str:
        if self.log_path is None or not self.log_path.is_file():
            return "(no log file to show)"
        try:
            if self._log_file is not None:
                self._log_file.flush()
        except (OSError, ValueError):
            pass
        with open(self.log_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            return f.read().decode("utf-8", errors="replace")

    def log_errors(self, max_lines: int = 20) -> str:
        """The log's error lines (glog ``E`` lines, failed loads): the cause, above the tables."""
        if self.log_path is None or not self.log_path.is_file():
            return ""
        picked = []
        with open(self.log_path, "rb") as f:
            for raw in f:
                line = raw.decode("utf-8", errors="replace").rstrip()
                if _ERROR_LINE.match(line) or "failed to load" in line or line.startswith("error:"):
                    picked.append(line)
        # The CUDA/NVML complaints of a CPU-only machine are noise here.
        picked = [l for l in picked if "CudaDriverHelper" not in l]
        return "\n".join(picked[-max_lines:])

    def _failure(self, what: str) -> RuntimeError:
        errors = self.log_errors()
        summary = f"\nerrors in the log:\n{errors}" if errors else ""
        return RuntimeError(
            f"{what} (command: {' '.join(self.command)}){summary}\n"
            f"--- tail of {self.log_path} ---\n{self.log_tail()}"
        )

    def start(self, timeout: float = 120.0) -> None:
        """Spawn tritonserver and wait until ``/v2/health/ready`` answers 200."""
        if self.is_alive():
            raise RuntimeError("tritonserver is already running")
        repo = Path(self.config.model_repository)
        if not repo.is_dir():
            raise FileNotFoundError(f"model repository {repo} does not exist")
        install = self._install or find_tritonserver()
        self._install = install
        self.command = self.build_command(install)
        self._log_file = self._open_log()
        t0 = time.monotonic()
        self._proc = subprocess.Popen(
            self.command,
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            env=install.environment(),
            start_new_session=True,  # own process group: stop() can reach the stubs too
        )
        ready_url = f"{self.http_url}/v2/health/ready"
        deadline = t0 + timeout
        try:
            while True:
                if self._proc.poll() is not None:
                    raise self._failure(f"tritonserver exited with code {self._proc.returncode} while starting")
                if _http_ok(ready_url):
                    self.startup_seconds = time.monotonic() - t0
                    return
                if time.monotonic() > deadline:
                    raise self._failure(f"tritonserver not ready after {timeout:.0f} s ({ready_url})")
                time.sleep(0.1)
        except BaseException:
            self.stop()
            raise

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
            if self._owns_log_file and self._log_file is not None:
                self._log_file.close()
            self._log_file = None
            self._owns_log_file = False

    def __enter__(self) -> "TritonServer":
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()


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


# No proxies: a loopback health check must not go through $http_proxy.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _http_ok(url: str) -> bool:
    try:
        with _OPENER.open(url, timeout=1.0) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False
