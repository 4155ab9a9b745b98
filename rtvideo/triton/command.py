"""What a ``tritonserver`` is started with: its command line for a `TritonConfig` and an
install, and its environment, whose malloc setting must not reach the Python backend's stubs.

Pure but for the stub environment's file, which `StubEnvironment` owns until the run ends.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from rtvideo.triton import access
from rtvideo.triton.install import TritonInstall

__all__ = ["StubEnvironment", "server_command", "shown_command"]


@dataclass
class TritonConfig:
    """What the server is started with: the repository, its addresses, its verbosity."""

    model_repository: Path
    grpc_port: int = 8001
    http_port: int = 8000
    metrics_port: int = 8002
    #: open Triton's HTTP endpoint (``http_port``); off by default (see the module docstring)
    http: bool = False
    host: str = "127.0.0.1"
    log_verbose: int = 0
    extra_args: list[str] = field(default_factory=list)
    # Shutdown grace for in-flight requests; open decoupled streams count as in flight.
    exit_timeout_secs: int = 5
    #: the access key (rtvideo.triton.access): None leaves every protocol open, as Triton does
    key: str | None = field(default=None, repr=False)
    #: ``--grpc-infer-allocation-pool-size``: request/response objects Triton keeps for reuse
    #: (its default, 8, keeps the memory of the largest requests seen; docs/security.md)
    grpc_infer_allocation_pool_size: int = 0
    #: glibc's ``MALLOC_MMAP_THRESHOLD_`` for tritonserver alone (not its stubs), unless the
    #: environment sets it or ``BASH_ENV``: the slices gRPC reads a large request into are then
    #: mapped and unmapped, not kept in malloc's heaps once the request was refused (a 300 MiB
    #: request left hundreds of MB behind each time). None: glibc's default
    malloc_mmap_threshold: int | None = 64 * 1024
    #: variables added to the environment of the server and its stubs (the model reads
    #: ``RTVIDEO_OTLP_ENDPOINT`` there: docs/operations.md "Traces")
    environment: dict[str, str] = field(default_factory=dict, repr=False)


def server_command(c: TritonConfig, install: TritonInstall, shm_prefix: str) -> list[str]:
    """The ``tritonserver`` command line for `c` with `install`'s directories; the Python
    backend's shared-memory names start with `shm_prefix`."""
    if c.http:
        http = ["--allow-http=true", f"--http-address={c.host}", f"--http-port={c.http_port}"]
    else:
        http = ["--allow-http=false"]
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
        *http,
        "--allow-metrics=true",
        f"--metrics-address={c.host}",
        f"--metrics-port={c.metrics_port}",
        f"--log-verbose={c.log_verbose}",
        f"--backend-config=python,shm-region-prefix-name={shm_prefix}",
        f"--grpc-infer-allocation-pool-size={c.grpc_infer_allocation_pool_size}",
    ]
    if c.key is not None:
        cmd.append(access.restricted_protocol_flag(c.key))
        if c.http:
            cmd.append(access.restricted_http_flag(c.key))
    if install.backend_directory is not None:
        cmd.append(f"--backend-directory={install.backend_directory}")
    if install.cache_directory is not None:
        cmd.append(f"--cache-directory={install.cache_directory}")
    cmd.extend(c.extra_args)
    return cmd


def shown_command(command: list[str], key: str | None) -> list[str]:
    """`command` as it may be shown (in an error, a log): `key` replaced by ``<key>``."""
    return [arg.replace(key, "<key>") for arg in command] if key else list(command)


class StubEnvironment:
    """The server's environment, and the ``BASH_ENV`` file that keeps its malloc setting from
    its stubs; the file lives until `remove` (the server's stop, or a failed spawn)."""

    def __init__(self) -> None:
        self._file: Path | None = None

    def build(self, install: TritonInstall, config: TritonConfig) -> dict[str, str]:
        """`install`'s environment, with `config.malloc_mmap_threshold`. The stubs must not
        inherit that (a fresh mapping for every frame-sized array is 10x slower): the Python
        backend starts each with `bash -c "exec <stub> ..."`, and bash first runs the file in
        ``BASH_ENV``, which gives them glibc's own behaviour back."""
        env = {**install.environment(), **config.environment}
        threshold = config.malloc_mmap_threshold
        if threshold is None or "MALLOC_MMAP_THRESHOLD_" in env or "BASH_ENV" in env:
            return env
        fd, path = tempfile.mkstemp(prefix="rtvideo-stub-env-", suffix=".sh")
        with os.fdopen(fd, "w") as f:
            f.write("unset MALLOC_MMAP_THRESHOLD_ BASH_ENV\n")
        self._file = Path(path)
        env["MALLOC_MMAP_THRESHOLD_"] = str(threshold)
        env["BASH_ENV"] = path
        return env

    def remove(self) -> None:
        if self._file is not None:
            self._file.unlink(missing_ok=True)
            self._file = None
