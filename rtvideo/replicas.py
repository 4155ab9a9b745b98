"""`rtvideo replicas`: replicas of the proxy to try on one machine (docs/operations.md "Trying
replicas locally"): one Triton (`rtvideo triton`), N proxies (`rtvideo serve --triton-url`)
sharing one `redis-server` as their session store, and HAProxy in front of them, every part a
real process started as an operator would start it. It prints one line per part (its pid and
address) and then one ready line with the balancer's WebSocket URL; Ctrl-C or SIGTERM stops them
all (HAProxy, then the proxies, which hand their sessions off, then Triton and Redis), with
nothing left running. A proxy that exits (SIGTERM it to try a rolling restart, or kill -9 it) is
started again on its port, as a Deployment would; Triton, Redis or HAProxy exiting ends the run.

HAProxy (Debian's `haproxy`) balances by `leastconn` (or `roundrobin`), checks each proxy's
`/readyz` every second (down after 2 failures: a draining proxy leaves within 2 s), retries a
connection a proxy refused, or answered 503 before the upgrade, on another one, keeps
WebSocket tunnels an hour, and names the client in `X-Forwarded-For`, which the proxies trust
from 127.0.0.1 (`--trusted-proxy`). Its stats page shows each proxy's state.

Secrets are never on a command line: the Triton key is generated into `triton.key` (0600) in
the run's directory, read there by `rtvideo triton` and handed to each proxy as
`RTVIDEO_TRITON_KEY`; Redis's password is in its configuration file (0600) and reaches the
proxies inside `RTVIDEO_SESSION_STORE` (the full URL is in `store.url`, 0600, for `redis-cli -u`).
Both files are removed at the end; the logs stay. (tritonserver itself takes the key as a flag:
docs/security.md "Access keys for Triton".)

Every child runs in its own session (a Ctrl-C in the terminal reaches this process alone, which
stops them in order) and behind `rtvideo.process.launch`, so it dies with this process even on
its kill -9.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rtvideo.process import launch
from rtvideo.replicas_config import free_port, haproxy_config, http_get, redis_answers, redis_config, write_private

DESCRIPTION = __doc__
READY_LINE = "rtvideo replicas ready: "
WS_PATH = "/v1/realtime/video"
BALANCES = ("leastconn", "roundrobin")
#: a proxy is taken as started once its backend is known: up, or busy (a full Triton is a healthy one)
KNOWN_BACKEND = ("up", "busy")
STOP_SECONDS = 90.0  # a proxy's drain with resumable sessions takes seconds; with others, up to 75 s


@dataclass
class Part:
    """One process of the run: what it is, its address, its process now, its log."""

    name: str
    address: str
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    port: int = 0
    runs: int = 0
    failures: int = 0  # starts in a row that failed (a proxy's restarts back off)
    next_start: float = 0.0  # monotonic time before which a failed proxy is not started again

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"


@dataclass
class LocalReplicas:
    """The run: start everything (`start`), keep the proxies running (`watch`), stop everything
    (`stop`). `serve_flags` go to every `rtvideo serve`; `triton_flags` to `rtvideo triton`
    (its model parameters, e.g. `--max-sessions 8`). A context manager too."""

    directory: Path
    proxies: int = 2
    port: int = 8080
    balance: str = "leastconn"
    model: str = "realtime_video"
    triton_flags: Sequence[str] = ()
    serve_flags: Sequence[str] = ()
    redis_maxmemory: str | None = None
    ready_seconds: float = 600.0
    say: bool = True  # print a line per part as it starts
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    parts: dict[str, Part] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.balance not in BALANCES:
            raise ValueError(f"balance {self.balance!r}: use {' or '.join(BALANCES)}")
        if not 1 <= self.proxies <= 16:
            raise ValueError(f"{self.proxies} proxies: use 1 to 16")
        self.directory.mkdir(parents=True, exist_ok=True)
        self.key = secrets.token_hex(32)
        self._redis_password = secrets.token_hex(24)
        self.stats_port = 0
        self.metrics_port = 0  # Triton's, once started

    # --- what clients and tools use ----------------------------------------------------------------
    @property
    def url(self) -> str:
        """The balancer's WebSocket URL."""
        return f"ws://127.0.0.1:{self.port}{WS_PATH}"

    @property
    def store_url(self) -> str:
        """The Redis URL with its password (a secret: for tools of this machine's operator)."""
        return f"redis://:{self._redis_password}@127.0.0.1:{self.parts['redis'].port}/0"

    def proxy(self, index: int) -> Part:
        return self.parts[f"proxy-{index}"]

    @property
    def proxy_parts(self) -> list[Part]:
        return [self.proxy(i) for i in range(self.proxies)]

    @property
    def triton_grpc(self) -> str:
        return self.parts["triton"].address

    # --- the run ------------------------------------------------------------------------------
    def start(self) -> LocalReplicas:
        for binary in ("redis-server", "haproxy"):
            if shutil.which(binary) is None:
                raise RuntimeError(f"{binary} is not installed (Debian: apt-get install -y redis-server haproxy)")
        try:
            self._start_redis()
            self._start_triton()
            for i in range(self.proxies):
                part = Part(f"proxy-{i}", "", self.directory / f"proxy-{i}.log", port=free_port())
                part.address = f"ws://127.0.0.1:{part.port}{WS_PATH}"
                self.parts[part.name] = part
                self._spawn_proxy(part)
            for part in self.proxy_parts:
                self._wait_proxy(part)
            self._start_haproxy()
        except BaseException:
            self.stop()
            raise
        return self

    def __enter__(self) -> LocalReplicas:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def watch(self) -> str:
        """Until a part other than a proxy exits (its name returned); a proxy that exits is started
        again on its port. Returns when interrupted (KeyboardInterrupt) too, by raising it."""
        while True:
            for part in list(self.parts.values()):
                if part.alive:
                    continue
                if not part.name.startswith("proxy-"):
                    return part.name
                if time.monotonic() < part.next_start:
                    continue  # one that failed to start waits 2, 4 … 30 s before the next try
                self._say(
                    f"{part.name} exited with code {part.proc.returncode if part.proc else '?'}; starting it again"
                )
                self._spawn_proxy(part)
                try:
                    self._wait_proxy(part)
                    part.failures = 0
                except RuntimeError as exc:
                    self._say(str(exc))
                    part.failures += 1
                    part.next_start = time.monotonic() + min(30.0, 2.0**part.failures)
            time.sleep(0.5)

    def stop(self) -> None:
        """Every part stopped (SIGTERM, then SIGKILL past its bound), in order: the balancer, the
        proxies (they hand their sessions off), Triton, Redis. The secrets' files removed."""
        order = ["haproxy", *(p for p in self.parts if p.startswith("proxy-")), "triton", "redis"]
        proxies = [self.parts[n] for n in order if n.startswith("proxy-") and n in self.parts]
        for name in order:
            part = self.parts.get(name)
            if part is None or not part.alive:
                continue
            if name.startswith("proxy-"):
                if part is proxies[0]:  # the proxies drain together
                    for p in proxies:
                        if p.alive:
                            assert p.proc is not None
                            p.proc.send_signal(signal.SIGTERM)
                    for p in proxies:
                        _end(p, STOP_SECONDS, signalled=True)
                continue
            _end(part, 30.0)
        for secret in ("triton.key", "redis.conf", "store.url"):
            (self.directory / secret).unlink(missing_ok=True)

    # --- each part ----------------------------------------------------------------------------
    def _say(self, line: str) -> None:
        if self.say:
            print(f"replicas: {line}", flush=True)

    def _spawn(self, part: Part, argv: list[str], env: Mapping[str, str], stdout: Path | None = None) -> None:
        part.runs += 1
        with part.log.open("ab") as log:
            log.write(f"=== rtvideo replicas: run {part.runs} of {part.name}\n".encode())
            log.flush()
            out = stdout.open("wb") if stdout is not None else log
            with out:
                part.proc = subprocess.Popen(
                    launch.command(argv),  # it dies with this process, even on kill -9
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=log,
                    env=dict(env),
                    start_new_session=True,  # a Ctrl-C in the terminal reaches this process alone
                )

    def _start_redis(self) -> None:
        part = Part("redis", "", self.directory / "redis.log", port=free_port())
        part.address = f"127.0.0.1:{part.port}"
        self.parts["redis"] = part
        config = self.directory / "redis.conf"
        write_private(config, redis_config(part.port, self._redis_password, self.directory, self.redis_maxmemory))
        self._spawn(part, [_which("redis-server"), str(config)], self.env)
        deadline = time.monotonic() + 20
        while not redis_answers(part.port, self._redis_password):
            if not part.alive or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start; its log:\n{part.tail()}")
            time.sleep(0.05)
        write_private(self.directory / "store.url", self.store_url + "\n")
        self._say(f"redis pid {part.pid} on {part.address} (its URL with the password: {self.directory / 'store.url'})")

    def _start_triton(self) -> None:
        grpc_port, metrics_port = free_port(), free_port()
        part = Part("triton", f"127.0.0.1:{grpc_port}", self.directory / "triton.log", port=grpc_port)
        self.parts["triton"] = part
        self.metrics_port = metrics_port
        key_file = self.directory / "triton.key"
        write_private(key_file, self.key + "\n")
        argv = [
            sys.executable, "-m", "rtvideo.cli", "triton",
            "--model", self.model,
            "--grpc-port", str(grpc_port),
            "--metrics-port", str(metrics_port),
            "--key-file", str(key_file),
            "--log", str(self.directory / "tritonserver.log"),
            *self.triton_flags,
        ]  # fmt: skip
        env = {k: v for k, v in self.env.items() if k != "RTVIDEO_TRITON_KEY"}  # its key is the file's
        out = self.directory / "triton.out"
        self._spawn(part, argv, env, stdout=out)
        deadline = time.monotonic() + self.ready_seconds
        while not _read(out).startswith("rtvideo triton ready: "):
            if not part.alive or time.monotonic() > deadline:
                raise RuntimeError(f"rtvideo triton did not start; its log:\n{part.tail()}")
            time.sleep(0.2)
        self._say(f"triton pid {part.pid}: grpc {part.address}, metrics port {metrics_port}; key in {key_file}")

    def _spawn_proxy(self, part: Part) -> None:
        argv = [
            sys.executable, "-m", "rtvideo.cli", "serve",
            "--triton-url", self.triton_grpc,
            "--triton-metrics-port", str(self.metrics_port),
            "--model", self.model,
            "--host", "127.0.0.1",
            "--port", str(part.port),
            "--advertise-url", f"http://127.0.0.1:{part.port}",
            "--trusted-proxy", "127.0.0.1",
            *self.serve_flags,
        ]  # fmt: skip
        env = {**self.env, "RTVIDEO_TRITON_KEY": self.key, "RTVIDEO_SESSION_STORE": self.store_url}
        self._spawn(part, argv, env, stdout=self.directory / f"{part.name}.out")

    def _wait_proxy(self, part: Part) -> None:
        deadline = time.monotonic() + self.ready_seconds
        out = self.directory / f"{part.name}.out"
        while not self._proxy_ready(part, out):
            if not part.alive or time.monotonic() > deadline:
                state = "exited" if not part.alive else f"not ready within {self.ready_seconds:g} s"
                raise RuntimeError(f"{part.name} {state}; its log:\n{part.tail()}")
            time.sleep(0.2)
        self._say(f"{part.name} pid {part.pid} on {part.address}")

    @staticmethod
    def _proxy_ready(part: Part, out: Path) -> bool:
        if not _read(out).startswith("rtvideo ready: "):
            return False
        try:
            _, body = http_get(f"http://127.0.0.1:{part.port}/readyz")
            return json.loads(body).get("backend") in KNOWN_BACKEND
        except (OSError, ValueError):
            return False

    def _start_haproxy(self) -> None:
        if self.port == 0:
            self.port = free_port()
        self.stats_port = free_port()
        part = Part("haproxy", f"127.0.0.1:{self.port}", self.directory / "haproxy.log", port=self.port)
        self.parts["haproxy"] = part
        config = self.directory / "haproxy.cfg"
        config.write_text(haproxy_config(self.port, self.stats_port, [p.port for p in self.proxy_parts], self.balance))
        self._spawn(part, [_which("haproxy"), "-f", str(config), "-db"], self.env)
        deadline = time.monotonic() + 30
        while True:  # up once it answers through to a proxy's /readyz
            with contextlib.suppress(OSError):
                if http_get(f"http://127.0.0.1:{self.port}/readyz")[0] == 200:
                    break
            if not part.alive or time.monotonic() > deadline:
                raise RuntimeError(f"haproxy did not start; its log:\n{part.tail()}")
            time.sleep(0.1)
        self._say(
            f"haproxy pid {part.pid} on {part.address} ({self.balance}; stats http://127.0.0.1:{self.stats_port}/stats)"
        )


def _which(binary: str) -> str:
    path = shutil.which(binary)
    if path is None:
        raise RuntimeError(f"{binary} is not installed")
    return path


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _end(part: Part, timeout: float, signalled: bool = False) -> None:
    """`part`'s process ended: SIGTERM (unless `signalled` already), SIGKILL after `timeout` s."""
    proc = part.proc
    if proc is None or proc.poll() is not None:
        return
    if not signalled:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--proxies", type=int, default=2, help="proxy replicas (default: 2)")
    parser.add_argument("--port", type=int, default=8080, help="the balancer's port (default: 8080; 0: a free one)")
    parser.add_argument("--balance", choices=BALANCES, default="leastconn", help="HAProxy's balancing")
    parser.add_argument("--model", default="realtime_video", help="the model Triton serves and the proxies use")
    parser.add_argument(
        "--max-sessions",
        metavar="N",
        help="the model's max_sessions (Triton's sequence slots; default: the model's own)",
    )
    parser.add_argument(
        "--redis-maxmemory", metavar="BYTES", help="Redis's maxmemory (e.g. 256mb; full, it refuses writes)"
    )
    parser.add_argument(
        "--dir", type=Path, help="where the logs and generated files go (default: a new temporary directory)"
    )
    parser.add_argument(
        "serve_flags",
        nargs=argparse.REMAINDER,
        metavar="-- SERVE FLAGS",
        help="flags for every `rtvideo serve` after --, e.g. -- --max-sessions-per-client 8",
    )


def main(args: argparse.Namespace) -> int:
    directory = args.dir or Path(tempfile.mkdtemp(prefix="rtvideo-replicas-"))
    flags = list(args.serve_flags)
    if flags[:1] == ["--"]:
        flags = flags[1:]
    try:
        run = LocalReplicas(
            directory,
            proxies=args.proxies,
            port=args.port,
            balance=args.balance,
            model=args.model,
            triton_flags=("--max-sessions", args.max_sessions) if args.max_sessions else (),
            serve_flags=flags,
            redis_maxmemory=args.redis_maxmemory,
        )
    except ValueError as exc:
        print(f"rtvideo replicas: error: {exc}", file=sys.stderr, flush=True)
        return 2

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    # SIGINT too, explicitly: started in the background by a shell, this process inherits it ignored
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, interrupt)
    code = 0
    try:
        run.start()
        print(f"{READY_LINE}{run.url} (logs in {directory})", flush=True)
        ended = run.watch()
        print(f"replicas: {ended} exited; stopping everything. Its log:\n{run.parts[ended].tail()}", flush=True)
        code = 1
    except KeyboardInterrupt:
        pass
    except (RuntimeError, ValueError) as exc:
        print(f"rtvideo replicas: {exc}", file=sys.stderr, flush=True)
        code = 1
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):  # stopping: a second signal must not orphan a part
            signal.signal(sig, signal.SIG_IGN)
        run.stop()
        print("replicas: stopped", flush=True)
    return code
