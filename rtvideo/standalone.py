"""`rtvideo triton`: one keyed tritonserver alone, for proxies started elsewhere with
`rtvideo serve --triton-url` (docs/operations.md "Trying replicas locally").

`rtvideo serve` without `--triton-url` starts its own Triton with a key that only it knows;
replicas of the proxy need one Triton they all reach, and its key. This command starts it with
the checkout's model repository (model parameters given here override `config.pbtxt` in a
derived copy, as serve's do), prints one ready line with its gRPC address and where its key is,
and stops it (its backend stubs and shared memory included) on SIGINT/SIGTERM. It exits 1 when
tritonserver dies on its own: restarting it is the job of whoever runs this command.

The key never travels on our command lines: it is `$RTVIDEO_TRITON_KEY` when set; else the
content of `--key-file` when that file exists; else a new one, written to `--key-file` (or to a
new temporary file, removed at the end) with mode 0600. Its operator reads it there and gives it
to each proxy as `RTVIDEO_TRITON_KEY`. Triton itself takes the key as a flag, so it is on
tritonserver's own command line (docs/security.md "Access keys for Triton").
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import stat
import sys
import tempfile
import time
from pathlib import Path

from rtvideo import logsetup, settings_text
from rtvideo.backend.loading.settings import BackendSettings
from rtvideo.triton.access import KEY_ENV, generate_key, key_from_env, restricted_protocol_flag
from rtvideo.triton.model_repo import MODEL_REPOSITORY, derive_model, read_candidate_sequences, read_parameters

log = logging.getLogger(__name__)

READY_LINE = "rtvideo triton ready: "
DESCRIPTION = __doc__


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=os.environ.get("RTVIDEO_MODEL", "realtime_video"), help="model to serve")
    parser.add_argument(
        "--model-repository",
        type=Path,
        default=MODEL_REPOSITORY,
        help=f"Triton model repository (default: {MODEL_REPOSITORY})",
    )
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="address the gRPC and metrics ports bind to (default: 127.0.0.1; a published one needs a Triton "
        "release without the shared-memory CVEs, NGC 25.07 or later: docs/security.md)",
    )
    parser.add_argument("--grpc-port", type=int, default=8001, metavar="PORT", help="gRPC port (default: 8001)")
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=8002,
        metavar="PORT",
        help="metrics port, where proxies read the model's heartbeat (their --triton-metrics-port; default: 8002)",
    )
    parser.add_argument(
        "--key-file",
        type=Path,
        metavar="PATH",
        help=f"the access key's file: read when it exists, else a new key is written there (mode 0600); "
        f"${KEY_ENV}, when set, is the key instead (default: a new temporary file, removed at the end)",
    )
    parser.add_argument(
        "--log", type=Path, metavar="PATH", help="tritonserver's log file (default: a new temporary file)"
    )
    parser.add_argument(
        "--start-timeout",
        type=float,
        default=1800.0,
        metavar="SECONDS",
        help="how long the model may take to load (default: 1800)",
    )
    parser.add_argument("--log-level", default=os.environ.get("RTVIDEO_LOG_LEVEL", "INFO"), help="log level")
    model = parser.add_argument_group(
        "model parameters (given ones override config.pbtxt in a derived copy of the model repository)"
    )
    settings_text.add_flags(model, BackendSettings, text_only=True)


class KeySource:
    """Where the key came from, and the file to remove at the end (a temporary one made here)."""

    def __init__(self, key: str, path: Path | None, made_temp: bool) -> None:
        self.key, self.path, self.made_temp = key, path, made_temp

    def describe(self) -> str:
        if self.path is None:
            return f"its key is ${KEY_ENV} as given"
        return f"its key is in {self.path} (mode 0600): give it to each proxy as {KEY_ENV}"

    def remove(self) -> None:
        if self.made_temp and self.path is not None:
            self.path.unlink(missing_ok=True)


def write_private(path: Path, text: str) -> None:
    """`text` in a new file `path` that only its owner may read (created 0600, never widened)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def read_key_file(path: Path) -> str:
    """The key in `path`; ValueError when others may read it (a key readable by every user of the
    machine is no key) or it holds none."""
    mode = path.stat().st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ValueError(f"{path}: others may read it (mode {stat.S_IMODE(mode):04o}); chmod 600 it")
    key = path.read_text().strip()
    restricted_protocol_flag(key)  # ValueError when empty or with whitespace or '='
    return key


def key_source(key_file: Path | None) -> KeySource:
    given = key_from_env()
    if given is not None:
        restricted_protocol_flag(given)
        return KeySource(given, None, False)
    if key_file is not None and key_file.exists():
        return KeySource(read_key_file(key_file), key_file, False)
    key = generate_key()
    if key_file is not None:
        write_private(key_file, key + "\n")
        return KeySource(key, key_file, False)
    fd, name = tempfile.mkstemp(prefix="rtvideo-triton-key-")  # 0600
    with os.fdopen(fd, "w") as f:
        f.write(key + "\n")
    return KeySource(key, Path(name), True)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(args: argparse.Namespace) -> int:
    from rtvideo.triton.command import TritonConfig
    from rtvideo.triton.server import TritonServer

    logsetup.configure(args.log_level)
    overrides = {
        name: settings_text.to_text(value) for name, value in settings_text.values_from(args, BackendSettings).items()
    }
    source = Path(args.model_repository) / args.model
    try:
        if not (source / "config.pbtxt").is_file():
            raise ValueError(f"model {args.model!r} not found in the model repository {args.model_repository}")
        BackendSettings.from_parameters({**read_parameters(source), **overrides}).check_sequence_slots(
            read_candidate_sequences(source)
        )
        keys = key_source(args.key_file)
    except (ValueError, OSError) as exc:
        print(f"rtvideo triton: error: {exc}", file=sys.stderr, flush=True)
        return 2
    signal.signal(signal.SIGTERM, _interrupt)  # like Ctrl-C
    triton: TritonServer | None = None
    try:
        with tempfile.TemporaryDirectory(prefix="rtvideo-repo-") as scratch:
            repo = Path(args.model_repository)
            if overrides:
                repo = Path(scratch)
                derive_model(repo, args.model, overrides, source=source)
            config = TritonConfig(
                model_repository=repo,
                grpc_port=args.grpc_port,
                metrics_port=args.metrics_port,
                host=args.host,
                key=keys.key,
            )
            triton = TritonServer(config, stdout=args.log)
            triton.start(timeout=args.start_timeout)
            print(
                f"{READY_LINE}grpc {triton.grpc_url} (model {args.model}, metrics port {args.metrics_port}, "
                f"pid {triton.pid}); {keys.describe()}",
                flush=True,
            )
            log.info("tritonserver ready in %.1f s (log: %s)", triton.startup_seconds, triton.log.describe())
            while triton.is_alive():
                time.sleep(0.5)
            log.error("tritonserver exited on its own; its log: %s", triton.log.describe())
            return 1
    except KeyboardInterrupt:
        return 0
    except RuntimeError as exc:  # it did not start: the error carries the tail of its log
        print(f"rtvideo triton: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):  # stopping: a second signal must not orphan Triton
            signal.signal(sig, signal.SIG_IGN)
        if triton is not None:
            with contextlib.suppress(Exception):
                triton.stop()
            log.info("tritonserver stopped")
        keys.remove()
