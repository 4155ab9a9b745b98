"""Triton endpoint addresses: `HOST:PORT` as the `--triton-url` setting gives them (no imports
beyond the standard library: the settings check them before anything starts)."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable


def split_address(url: str) -> tuple[str, int]:
    """`HOST:PORT` (an IPv6 address in brackets) → (host, port); ValueError when it is not one."""
    text = url.strip()
    host, sep, port = text.rpartition(":")
    bad = ValueError(f"Triton URL {url!r}: give HOST:PORT (no scheme; an IPv6 address in brackets)")
    if "://" in text or not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise bad
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise bad from None
    elif ":" in host or "[" in host or "]" in host or "/" in host or any(c.isspace() for c in host):
        raise bad
    return host, int(port)


def join_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_urls(urls: str | Iterable[str]) -> tuple[str, ...]:
    """Comma-separated (and/or several) `HOST:PORT`, each checked, duplicates dropped."""
    parts = urls.split(",") if isinstance(urls, str) else [p for u in urls for p in u.split(",")]
    found = tuple(dict.fromkeys(p.strip() for p in parts if p.strip()))
    if not found:
        raise ValueError("no Triton URL given")
    for url in found:
        split_address(url)
    return found


def is_ip_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
