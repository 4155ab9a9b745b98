"""Triton's access key (rtvideo.triton.access) and where it goes: the tritonserver command line
(and nowhere it is shown), the clients' header, `rtvideo serve`'s refusal of a published Triton
without a key, the key it generates otherwise, and its warning for an affected Triton release."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any, ClassVar

import pytest

from rtvideo import cli
from rtvideo.triton import access
from rtvideo.triton.command import TritonConfig
from rtvideo.triton.install import TritonInstall
from rtvideo.triton.server import TritonServer, is_affected


@pytest.fixture(autouse=True)
def _root_logging_kept() -> Any:
    """`cli.main` sets the root handler up on the sys.stderr of its moment, here pytest's capture
    of one test, closed after it: put the handlers back, or every later log line of this process
    (a proxy's thread) fails with "I/O operation on closed file"."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)


def test_the_restriction_covers_every_group_but_health() -> None:
    groups = {"health", "metadata", "inference", "shared-memory", "model-config", "model-repository"}
    groups |= {"statistics", "trace", "logging"}  # Triton 2.51's list (tritonserver --help)
    assert set(access.RESTRICTED_GROUPS) == groups - {"health"}
    flag = access.restricted_protocol_flag("k3y")
    assert flag == f"--grpc-restricted-protocol={','.join(access.RESTRICTED_GROUPS)}:rtvideo-key=k3y"  # colon
    assert access.restricted_http_flag("k3y") == flag.replace("--grpc-restricted-protocol", "--http-restricted-api")
    for bad in ("", "two words", "a=b", "tab\there"):
        with pytest.raises(ValueError):
            access.restricted_protocol_flag(bad)


def test_headers_keys_and_secrets() -> None:
    assert access.key_headers(None) == {} and access.key_headers("") == {}
    assert access.key_headers("k") == {"triton-grpc-protocol-rtvideo-key": "k"}  # lowercase: gRPC metadata
    keys = {access.generate_key() for _ in range(20)}
    assert len(keys) == 20 and all(len(k) >= 32 and access.restricted_protocol_flag(k) for k in keys)
    assert len(access.new_session_secret()) >= 16
    assert access.short_hash(12345) == access.short_hash("12345") and len(access.short_hash("x")) == 12
    assert int(access.short_hash("x"), 16) >= 0


def test_key_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(access.KEY_ENV, raising=False)
    assert access.key_from_env() is None
    monkeypatch.setenv(access.KEY_ENV, "  ")
    assert access.key_from_env() is None
    monkeypatch.setenv(access.KEY_ENV, "abc")
    assert access.key_from_env() == "abc"


INSTALL = TritonInstall(binary=Path("/opt/tritonserver/bin/tritonserver"), kind="path")


def _server(tmp_path: Path, install: TritonInstall = INSTALL, **config: Any) -> TritonServer:
    return TritonServer(TritonConfig(tmp_path, **config), install=install)


def test_the_key_is_on_the_command_line_and_hidden_where_it_is_shown(tmp_path: Path) -> None:
    server = _server(tmp_path, key="s3cret-key", http=True)
    server.command = server.build_command(INSTALL)
    assert access.restricted_protocol_flag("s3cret-key") in server.command
    assert access.restricted_http_flag("s3cret-key") in server.command  # the HTTP endpoint too, when open
    assert "--grpc-infer-allocation-pool-size=0" in server.command
    assert not any("s3cret-key" in a for a in server.shown_command)
    assert any(a.endswith(":rtvideo-key=<key>") for a in server.shown_command)
    assert server.client_headers() == {"triton-grpc-protocol-rtvideo-key": "s3cret-key"}
    assert "s3cret-key" not in repr(server.config)
    open_server = _server(tmp_path)
    command = open_server.build_command(INSTALL)
    assert not any("restricted" in a for a in command) and open_server.client_headers() == {}


def _spawned_environment(tmp_path: Path) -> tuple[TritonServer, dict[str, str]]:
    """A server spawned on a stand-in `tritonserver` that writes out the environment it got."""
    dump = tmp_path / "environment"
    dump.unlink(missing_ok=True)
    binary = tmp_path / "tritonserver"
    binary.write_text(f"#!/bin/sh\nenv -0 > {dump}.part && mv {dump}.part {dump}\nexec sleep 60\n")
    binary.chmod(0o755)
    server = _server(tmp_path, TritonInstall(binary=binary, kind="path"))
    server.spawn()
    deadline = time.monotonic() + 30
    while not dump.exists():
        assert time.monotonic() < deadline and server.is_alive(), "the stand-in tritonserver did not start"
        time.sleep(0.05)
    entries = dump.read_bytes().decode().split("\0")
    return server, dict(entry.split("=", 1) for entry in entries if "=" in entry)


def test_the_malloc_setting_is_for_tritonserver_not_its_stubs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    monkeypatch.delenv("BASH_ENV", raising=False)
    server, env = _spawned_environment(tmp_path)
    try:
        assert env["MALLOC_MMAP_THRESHOLD_"] == "65536"
        # The Python backend starts a stub with `bash -c "exec <stub> ..."`: bash runs BASH_ENV first.
        assert Path(env["BASH_ENV"]).read_text() == "unset MALLOC_MMAP_THRESHOLD_ BASH_ENV\n"
    finally:
        server.stop(timeout=5)
    assert not Path(env["BASH_ENV"]).exists()  # gone with the server
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "131072")  # the deployer's own setting wins
    server, env = _spawned_environment(tmp_path)
    server.stop(timeout=5)
    assert env["MALLOC_MMAP_THRESHOLD_"] == "131072" and "BASH_ENV" not in env


@pytest.mark.parametrize(
    "version,affected",
    [("2.51.0", True), ("2.59.0", True), ("2.59.1", False), ("2.60.0", False), ("3.0", False), ("", True)],
)
def test_affected_releases(version: str, affected: bool) -> None:
    assert is_affected(version) is affected


@pytest.mark.parametrize(
    "host,loopback",
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.5", False),
        ("triton.internal", False),
    ],
)
def test_loopback(host: str, loopback: bool) -> None:
    assert cli.is_loopback(host) is loopback


def test_serve_refuses_a_published_triton_without_a_key(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(access.KEY_ENV, raising=False)
    with pytest.raises(SystemExit) as exit_:
        cli.main(["serve", "--triton-host", "0.0.0.0"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "would publish Triton's gRPC port with no access key" in err and len(err.strip().splitlines()) == 1
    args = cli.build_parser().parse_args(["serve", "--triton-host", "0.0.0.0", "--triton-key", "k3y"])
    cli.check_settings(args)  # with a key it is allowed
    args = cli.build_parser().parse_args(["serve", "--triton-url", "10.0.0.5:8001"])
    args.triton_url, args.triton_key = "10.0.0.5:8001", None
    cli.check_settings(args)  # someone else's Triton: its key, if it has one, is the deployer's business


class _FakeTriton:
    """Stands for TritonServer in `cli.serve`: records its config, then ends the serve."""

    started: ClassVar[list[Any]] = []

    def __init__(self, config: Any, **_: Any) -> None:
        self.config = config

    def start(self, timeout: float, progress: Any = None) -> None:
        _FakeTriton.started.append(self.config)
        raise KeyboardInterrupt  # as Ctrl-C during the start

    def stop(self) -> None:
        pass


def test_serve_generates_a_key_and_shows_it_nowhere(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    import rtvideo.triton.server

    monkeypatch.delenv(access.KEY_ENV, raising=False)
    monkeypatch.setattr(rtvideo.triton.server, "TritonServer", _FakeTriton)
    _FakeTriton.started.clear()
    caplog.set_level(logging.DEBUG)
    for _ in range(2):
        assert cli.main(["serve", "--log-level", "DEBUG"]) == 0
    first, second = (c.key for c in _FakeTriton.started)
    assert first and second and first != second and len(first) >= 32  # a new one per start of serve
    out = capsys.readouterr()
    shown = out.out + out.err + caplog.text
    assert first not in shown and second not in shown
    monkeypatch.setenv(access.KEY_ENV, "given-key")
    assert cli.main(["serve"]) == 0
    assert _FakeTriton.started[-1].key == "given-key"


def test_serve_warns_when_it_publishes_an_affected_triton(caplog: pytest.LogCaptureFixture) -> None:
    class Published:
        config = TritonConfig(Path("."), host="0.0.0.0", key="k")

        def __init__(self, version: str | None) -> None:
            self.version = version

        def server_version(self) -> str | None:
            return self.version

    caplog.set_level(logging.WARNING)
    cli.warn_if_affected(Published("2.51.0"))  # type: ignore[arg-type]
    assert "CVE-2025-23319" in caplog.text and "2.51.0" in caplog.text and "0.0.0.0" in caplog.text
    caplog.clear()
    cli.warn_if_affected(Published("2.60.0"))  # type: ignore[arg-type]
    assert not caplog.records
    cli.warn_if_affected(Published(None))  # type: ignore[arg-type]
    assert "version unknown" in caplog.text
    assert os.environ.get("RTVIDEO_LOG_FORMAT") in (None, "text", "json")


@pytest.mark.parametrize("value", ["0", "-5", "nan", "inf", "soon"])
def test_a_start_timeout_that_is_not_a_positive_number_is_a_usage_error(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["serve", "--triton-start-timeout", value])
    assert exited.value.code == 2
    assert f"use a positive number of seconds, not {value!r}" in capsys.readouterr().err
