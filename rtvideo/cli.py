"""The `rtvideo` command.

`rtvideo serve`: Triton with this checkout's model repository, then the WebSocket proxy.
Prints one line on stdout when ready. SIGINT/SIGTERM drain the proxy (`/readyz` 503, new
sessions refused, live ones get up to `--drain-seconds`, then `server_shutdown`; a second
signal cuts the wait short) and then stop Triton, leaving no process behind. While serving, the proxy's
supervisor probes the model; when it stops answering, the Triton started here is
restarted (`_restart`). Triton dies with this process, even on `kill -9`. The Triton started
here always has an access key (`--triton-key` / `RTVIDEO_TRITON_KEY`, else one generated at start
and known only to this process and its proxy; docs/security.md); bound elsewhere than loopback
it must be given one.

`rtvideo triton`: one keyed Triton alone (`rtvideo.standalone`); `rtvideo replicas`: one
Triton, several proxies, Redis and HAProxy on this machine, to try replicas (`rtvideo.replicas`).

`rtvideo record`: a WebSocket client that records one session (`rtvideo.client.record`).
It needs only `websockets` and PyAV: the serving modules (Tornado, tritonclient, torch)
are imported by `serve` alone, so this module imports none of them at the top.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import ipaddress
import logging
import math
import os
import signal
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from rtvideo import logsetup, settings_text
from rtvideo.backend.loading.settings import BackendSettings
from rtvideo.proxy import settings as proxy_settings
from rtvideo.triton.model_repo import MODEL_REPOSITORY, derive_model, read_candidate_sequences, read_parameters

if TYPE_CHECKING:
    from rtvideo.triton.server import TritonServer

log = logging.getLogger(__name__)


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line (`rtvideo serve: error: ...`) and exit code 2, no usage dump."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="rtvideo", description="Realtime text-to-video on Triton")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    serve = commands.add_parser("serve", help="start Triton and the WebSocket proxy")
    # --triton-metrics-port is serve's own flag below: the Triton started here, or those of --triton-url
    proxy_settings.add_arguments(serve, skip=("triton_url", "triton_metrics_port"))
    serve.add_argument(
        "--triton-url",
        action="append",
        metavar="HOST:PORT",
        help="use this running Triton (gRPC) instead of starting one; repeat for several (sessions "
        "are placed over them); a HOST name counts once per address it resolves to "
        "(default: RTVIDEO_TRITON_URL, comma-separated)",
    )
    serve.add_argument(
        "--triton-start-timeout",
        type=_positive_seconds,
        default=os.environ.get("RTVIDEO_TRITON_START_TIMEOUT", "1800"),  # parsed by `type`, errors included
        metavar="SECONDS",
        help="how long the Triton started here may take to load its model before serve gives up, "
        "with a progress line every 15 s (default 1800: a 14B model's cold start from a slow disk; "
        "RTVIDEO_TRITON_START_TIMEOUT)",
    )
    serve.add_argument(
        "--model-repository",
        type=Path,
        default=MODEL_REPOSITORY,
        help=f"Triton model repository (default: {MODEL_REPOSITORY})",
    )
    serve.add_argument(
        "--triton-host",
        default=os.environ.get("RTVIDEO_TRITON_HOST", "127.0.0.1"),
        metavar="HOST",
        help="address the Triton started here binds its gRPC, HTTP and metrics ports to "
        "(default: 127.0.0.1; 0.0.0.0 to publish them, which needs --triton-key; the proxy still uses loopback then)",
    )
    serve.add_argument(
        "--triton-log",
        type=_log_target,
        default=_log_target(os.environ.get("RTVIDEO_TRITON_LOG")),
        metavar="PATH|-",
        help="log file of the Triton started here, or - for this process's standard error (default: a new temp file)",
    )
    for name, port in (("grpc", 8001), ("http", 8000), ("metrics", 8002)):
        serve.add_argument(
            f"--triton-{name}-port",
            type=int,
            default=port,
            metavar="PORT",
            help=f"{name} port of the Triton started here (default: {port})"
            + (
                "; with --triton-url, the metrics port of those Tritons, where the supervisor reads the "
                "model's heartbeat to tell a busy model from a dead one (0: not read)"
                if name == "metrics"
                else ""
            ),
        )
    serve.add_argument(
        "--triton-trace",
        default=os.environ.get("RTVIDEO_TRITON_TRACE"),
        metavar="HOST:PORT/v1/traces",
        help="Triton's own OpenTelemetry traces of every request, over OTLP/HTTP to this collector "
        '(--trace-config mode=opentelemetry; docs/operations.md "Traces"; default: off, RTVIDEO_TRITON_TRACE)',
    )
    serve.add_argument(
        "--triton-http",
        action="store_true",
        help="open the HTTP endpoint of the Triton started here on --triton-http-port "
        "(off by default: it takes unauthenticated POSTs that any web page can send)",
    )
    model = serve.add_argument_group(
        "model parameters (given ones override config.pbtxt in a derived copy of the model repository)"
    )
    settings_text.add_flags(model, BackendSettings, text_only=True)
    serve.add_argument("--log-level", default=os.environ.get("RTVIDEO_LOG_LEVEL", "INFO"), help="proxy log level")
    serve.add_argument(
        "--log-format",
        choices=logsetup.FORMATS,
        default=os.environ.get("RTVIDEO_LOG_FORMAT", "text"),
        help="text lines, or one JSON object per line with request_id/event_id fields",
    )
    from rtvideo.client import record  # websockets only; PyAV when the recording is saved

    record.add_arguments(
        commands.add_parser(
            "record",
            help="record one session to an MP4 (a WebSocket client)",
            description=record.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
    )
    from rtvideo import standalone

    standalone.add_arguments(
        commands.add_parser(
            "triton",
            help="start one keyed Triton alone, for proxies started with --triton-url",
            description=standalone.DESCRIPTION,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
    )
    from rtvideo import replicas

    replicas.add_arguments(
        commands.add_parser(
            "replicas",
            help="try replicas locally: one Triton, N proxies, Redis and HAProxy",
            description=replicas.DESCRIPTION,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
    )
    from rtvideo.backend.replay import command as replay_command  # torch and PyAV only when it runs

    replay_command.add_arguments(
        commands.add_parser(
            "replay",
            help="re-generate a built-in generator's recording to an MP4, in process (no Triton)",
            description=replay_command.DESCRIPTION,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
    )
    return parser


def _log_target(value: str | None) -> str | Path | None:
    """--triton-log: "-" (standard error), a path, or unset (a temp file)."""
    from rtvideo.triton.logs import STDERR

    if not value:
        return None
    return STDERR if value == STDERR else Path(value)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "record":
        from rtvideo.client import record

        return record.main(args)
    if args.command == "triton":
        from rtvideo import standalone

        return standalone.main(args)
    if args.command == "replicas":
        from rtvideo import replicas

        return replicas.main(args)
    if args.command == "replay":
        from rtvideo.backend.replay import command as replay_command

        return replay_command.main(args)
    urls = args.triton_url or [os.environ.get("RTVIDEO_TRITON_URL") or ""]
    args.triton_url = ",".join(u.strip() for u in urls if u.strip()) or None  # the setting: comma-separated
    args.triton_key = args.triton_key or None  # RTVIDEO_TRITON_KEY="" is no key
    try:  # every value is checked before anything starts: a bad one is one line, exit 2
        check_settings(args)
    except ValueError as exc:
        parser.exit(2, f"rtvideo {args.command}: error: {exc}\n")
    logsetup.configure(args.log_level, fmt=args.log_format)
    os.environ["RTVIDEO_LOG_FORMAT"] = args.log_format  # the model, in Triton's stub, logs alike
    return serve(args)


def model_overrides(args: argparse.Namespace) -> dict[str, str]:
    """The model parameters given on the command line, as `config.pbtxt` text."""
    return {
        name: settings_text.to_text(value) for name, value in settings_text.values_from(args, BackendSettings).items()
    }


def check_settings(args: argparse.Namespace) -> None:
    """The proxy's settings, the log's, the ports of a Triton started here, and the model's
    parameters as the model would load them."""
    proxy_settings.from_namespace(args, triton_url=args.triton_url or "127.0.0.1:1")
    # argparse checks neither a default taken from the environment against `choices` nor a level.
    if not isinstance(logging.getLevelName(str(args.log_level).upper()), int):
        raise ValueError(f"--log-level (or RTVIDEO_LOG_LEVEL) {args.log_level!r}: use DEBUG, INFO, WARNING or ERROR")
    if args.log_format not in logsetup.FORMATS:
        raise ValueError(
            f"--log-format (or RTVIDEO_LOG_FORMAT) {args.log_format!r}: use {' or '.join(logsetup.FORMATS)}"
        )
    for name in ("grpc", "http", "metrics"):
        port = getattr(args, f"triton_{name}_port")
        if args.triton_url is None and not 1 <= port <= 65535:
            raise ValueError(f"--triton-{name}-port {port}: use a port from 1 to 65535")
    overrides = model_overrides(args)
    if args.triton_url is not None and overrides:
        raise ValueError("model parameters need a Triton started here; drop --triton-url")
    if args.triton_url is None and (not args.triton_host or any(c.isspace() or c in "/[]" for c in args.triton_host)):
        raise ValueError(f"--triton-host {args.triton_host!r}: give an address (127.0.0.1, 0.0.0.0, ::) or a host name")
    if args.triton_key is not None:
        from rtvideo.triton.access import restricted_protocol_flag

        try:
            restricted_protocol_flag(args.triton_key)
        except ValueError:
            raise ValueError("--triton-key (or RTVIDEO_TRITON_KEY): give a key without whitespace or '='") from None
    if args.triton_url is None and args.triton_key is None and not is_loopback(args.triton_host):
        raise ValueError(
            f"--triton-host {args.triton_host} would publish Triton's gRPC port with no access key: give one "
            "(--triton-key or RTVIDEO_TRITON_KEY; clients send it, docs/security.md), or keep Triton on 127.0.0.1"
        )
    source = Path(args.model_repository) / args.model
    if args.triton_url is None:
        if not (source / "config.pbtxt").is_file():
            raise ValueError(f"model {args.model!r} not found in the model repository {args.model_repository}")
        settings = BackendSettings.from_parameters({**read_parameters(source), **overrides})
        settings.check_sequence_slots(read_candidate_sequences(source))


def is_loopback(host: str) -> bool:
    """Whether `host` (an address or a name) binds to this machine's loopback only: 127.0.0.0/8,
    ::1, localhost. Any other name counts as reachable from elsewhere."""
    if host.lower() in ("localhost", "localhost.localdomain", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve(args: argparse.Namespace) -> int:
    """Triton (unless --triton-url), then the proxy until SIGINT/SIGTERM; Triton is always stopped."""
    from rtvideo.triton.access import generate_key
    from rtvideo.triton.command import TritonConfig
    from rtvideo.triton.server import TritonServer, trace_args

    overrides = model_overrides(args)
    signal.signal(signal.SIGTERM, _interrupt)  # like Ctrl-C until the proxy's loop takes over
    triton: TritonServer | None = None
    with tempfile.TemporaryDirectory(prefix="rtvideo-repo-") as scratch:
        try:
            triton_url = args.triton_url
            key = args.triton_key
            if triton_url is None:
                # A Triton started here always gets a key: the one given, else a new one that only
                # this process (and its proxy) knows; its restarts keep it (the same TritonConfig).
                key = key or generate_key()
                repo = args.model_repository
                if overrides:
                    repo = Path(scratch)
                    derive_model(repo, args.model, overrides, source=args.model_repository / args.model)
                triton = TritonServer(
                    TritonConfig(
                        model_repository=repo,
                        grpc_port=args.triton_grpc_port,
                        http_port=args.triton_http_port,
                        metrics_port=args.triton_metrics_port,
                        http=args.triton_http,
                        host=args.triton_host,
                        key=key,
                        extra_args=trace_args(args.triton_trace),  # Triton's own traces (--triton-trace)
                        # the model exports its spans where the proxy does (docs/operations.md "Traces")
                        environment={"RTVIDEO_OTLP_ENDPOINT": args.otlp_endpoint} if args.otlp_endpoint else {},
                    ),
                    stdout=args.triton_log,
                )
                triton.start(timeout=args.triton_start_timeout, progress=_loading_progress(args.triton_start_timeout))
                log.info(
                    "tritonserver ready in %.1f s on %s (log: %s)",
                    triton.startup_seconds,
                    args.triton_host,
                    triton.log.describe(),
                )
                if not is_loopback(args.triton_host):
                    warn_if_affected(triton)
                triton_url = triton.grpc_url
            settings = proxy_settings.from_namespace(args, triton_url=triton_url, triton_key=key)
            return asyncio.run(_run_proxy(settings, triton, args.triton_start_timeout))
        except KeyboardInterrupt:
            return 0
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):  # stopping: a second signal must not orphan Triton
                signal.signal(sig, signal.SIG_IGN)
            if triton is not None:
                triton.stop()
                log.info("tritonserver stopped")


def warn_if_affected(triton: TritonServer) -> None:
    """A WARNING when the Triton just started on a published address is a release that carries
    the Python backend's shared-memory CVEs (docs/security.md); its version from its metadata."""
    from rtvideo.triton.server import FIXED_RELEASE, is_affected

    version = triton.server_version()
    if version is None or is_affected(version):
        log.warning(
            "tritonserver %s on %s: Triton releases before %s (NGC 25.07) carry CVE-2025-23319/23320/23334; "
            "its gRPC port needs the key and must not be reachable by untrusted clients (docs/security.md)",
            version or "(version unknown)",
            triton.config.host,
            ".".join(map(str, FIXED_RELEASE)),
        )


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


async def _run_proxy(
    settings: proxy_settings.ProxySettings, triton: TritonServer | None, start_timeout: float = 1800.0
) -> int:
    """Serve until a signal, then drain (exit 0); the supervisor restarts the Triton started here when needed."""
    from rtvideo.proxy.app import ProxyServer

    # grpc.aio hands each reply from its poller thread to this loop; a 1 ms GIL switch interval
    # (the default is 5 ms) keeps that hand-over from waiting long behind a busy thread.
    sys.setswitchinterval(0.001)
    gc.freeze()  # what was imported stays: no full collection walks it again and stalls the loop
    signals = asyncio.Queue[int]()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, signals.put_nowait, sig)
    server = ProxyServer(settings, restart=(lambda: _restart(triton, start_timeout)) if triton is not None else None)
    await server.start()
    print(f"rtvideo ready: {server.url} (triton grpc {settings.triton_url})", flush=True)
    first = await signals.get()
    log.info("%s: draining", signal.Signals(first).name)
    cut = asyncio.Event()  # a second signal ends the drain at once

    async def second_signal() -> None:
        await signals.get()
        log.info("a second signal: the drain is cut short")
        cut.set()

    waiter = asyncio.ensure_future(second_signal())
    try:
        await server.drain(settings.drain_seconds, cut)
        await server.stop()
    finally:
        waiter.cancel()
    return 0


def _positive_seconds(text: str) -> float:
    """A positive, finite number of seconds (argparse's `type`)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"use a positive number of seconds, not {text!r}")
    return value


def _loading_progress(timeout: float) -> Callable[[float, str], None]:
    """A progress line while Triton loads the model (a large model's weights take minutes)."""

    def show(elapsed: float, states: str) -> None:
        log.info("waiting for tritonserver: %.0f s of %.0f s; models: %s", elapsed, timeout, states)

    return show


async def _restart(triton: TritonServer, start_timeout: float) -> None:
    """Stop the Triton started here at once (its model does not answer: nothing to wait for), with
    its stubs and shared memory, and start it again on the same ports. The spawn runs on the event
    loop's thread, the main thread, because the server is killed when its spawning thread ends."""
    old = triton.pid
    await asyncio.to_thread(triton.stop, 0)
    triton.spawn()
    try:
        await asyncio.to_thread(triton.wait_ready, start_timeout, _loading_progress(start_timeout))
    except asyncio.CancelledError:
        # Shutting down mid-restart: nobody will use this Triton. Killed now, the waiting thread
        # sees it exit within 0.1 s and cleans up; else the exit would wait for its whole start-up.
        if triton.pid is not None:  # spawn() set it
            with contextlib.suppress(ProcessLookupError):
                os.killpg(triton.pid, signal.SIGKILL)  # its process group (it leads its own session)
        raise
    log.info("tritonserver restarted in %.1f s (pid %s, was %s)", triton.startup_seconds, triton.pid, old)


if __name__ == "__main__":
    sys.exit(main())
