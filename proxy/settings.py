"""Proxy settings: one dataclass, filled from command-line flags whose defaults come from the environment."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, fields
from typing import Any

MiB = 1024 * 1024


@dataclass(frozen=True)
class ProxySettings:
    """Everything the WebSocket proxy needs; the defaults are the documented ones."""

    host: str = "127.0.0.1"
    port: int = 8080
    #: Triton gRPC endpoint, `host:port` (no scheme), as tritonclient expects
    triton_url: str = "127.0.0.1:8001"
    model: str = "realtime_video"
    #: extra allowed browser origins (`scheme://host[:port]`, or `*`); same-origin and localhost always pass
    allowed_origins: tuple[str, ...] = ()
    #: when set, clients must send `Authorization: Bearer <token>` or `?token=<token>`
    token: str | None = None
    max_connections: int = 64
    #: bytes a session may have queued towards a client that does not read, before `slow_consumer`
    outbound_buffer_bytes: int = 16 * MiB
    start_timeout: float = 10.0
    #: WebSocket ping every N s (0: off); a peer that does not answer within `ping_timeout` s is closed
    ping_interval: float = 20.0
    ping_timeout: float = 20.0

    def __post_init__(self) -> None:
        if self.max_connections < 1 or self.outbound_buffer_bytes < 1 or self.start_timeout <= 0:
            raise ValueError("max_connections, outbound_buffer_bytes and start_timeout must be positive")
        if self.ping_interval < 0 or self.ping_timeout <= 0:
            raise ValueError("ping_interval must be >= 0 and ping_timeout positive")
        if self.ping_interval and self.ping_timeout > self.ping_interval:
            raise ValueError("ping_timeout cannot exceed ping_interval (Tornado would shorten it)")


#: flag name → (settings field, help); defaults come from RTVIDEO_<FIELD> or the dataclass
_FLAGS: dict[str, tuple[str, str]] = {
    "--host": ("host", "address the proxy listens on"),
    "--port": ("port", "port of the proxy"),
    "--triton-url": ("triton_url", "Triton gRPC host:port"),
    "--model": ("model", "Triton model name"),
    "--allow-origin": ("allowed_origins", "extra allowed Origin (repeatable; '*' allows any)"),
    "--token": ("token", "bearer token clients must present"),
    "--max-connections": ("max_connections", "concurrent WebSocket sessions (503 beyond)"),
    "--outbound-buffer-bytes": ("outbound_buffer_bytes", "per-session outbound buffer before slow_consumer"),
    "--start-timeout": ("start_timeout", "seconds to wait for session.start"),
    "--ping-interval": ("ping_interval", "WebSocket ping interval in seconds (0: off)"),
    "--ping-timeout": ("ping_timeout", "close a peer that answers a ping not within this many seconds"),
}


def add_arguments(parser: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> None:
    """Add the proxy flags (except those in `skip`) to `parser`; env RTVIDEO_<FIELD> sets defaults."""
    defaults = ProxySettings()
    types = {f.name: f.type for f in fields(ProxySettings)}
    for flag, (name, help_text) in _FLAGS.items():
        if flag in skip:
            continue
        raw = os.environ.get(f"RTVIDEO_{name.upper()}")
        default: Any = getattr(defaults, name)
        if name == "allowed_origins":  # flags add to the comma-separated env list
            origins = [o.strip() for o in (raw or "").split(",") if o.strip()]
            parser.add_argument(flag, dest=name, action="append", default=origins, metavar="ORIGIN", help=help_text)
            continue
        kind = _parser_type(types[name])
        value = kind(raw) if raw is not None else default
        shown = "" if name == "token" else f" (default: {value})"  # never print a secret
        parser.add_argument(flag, dest=name, type=kind, default=value, metavar=name.split("_")[-1].upper(),
                            help=help_text + shown)


def _parser_type(annotation: Any) -> Any:
    text = str(annotation)
    if text.startswith("int"):
        return int
    if text.startswith("float"):
        return float
    return str


def from_namespace(ns: argparse.Namespace, **overrides: Any) -> ProxySettings:
    """Settings from parsed flags (see `add_arguments`), with explicit overrides on top."""
    values = {f.name: getattr(ns, f.name) for f in fields(ProxySettings) if hasattr(ns, f.name)}
    values["allowed_origins"] = tuple(values.get("allowed_origins") or ())
    values.update(overrides)
    return ProxySettings(**values)
