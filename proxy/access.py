"""Who may connect: the Host the request names, the browser Origin, the bearer token, and how
many sessions one client address holds (all checked before the upgrade)."""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Callable, Iterable
from urllib.parse import urlsplit

from tornado.httputil import HTTPServerRequest, split_host_and_port
from tornado.web import RequestHandler

#: names of this machine: pages served from them are local development pages
LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})


def token_ok(request: HTTPServerRequest, token: str | None) -> bool:
    """`Authorization: Bearer <token>` or `?token=<token>`; anything passes when no token is set."""
    if token is None:
        return True
    scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not presented:
        values = request.query_arguments.get("token") or [b""]
        presented = values[-1].decode("utf-8", "replace")
    return hmac.compare_digest(presented.strip().encode(), token.encode())


def refused_without_token(
    handler: RequestHandler, token: str | None, rejected: Callable[[str], None] | None = None
) -> bool:
    """Answer 401 with the Bearer challenge when the request lacks the token (`rejected` counts
    it, as `ProxyMetrics.connection_rejected` does for upgrades); True when it was refused."""
    if token_ok(handler.request, token):
        return False
    if rejected is not None:
        rejected("unauthorized")
    handler.set_header("WWW-Authenticate", 'Bearer realm="rtvideo"')
    handler.send_error(401)
    return True


def is_loopback(host: str) -> bool:
    """Whether a bind address (or name) only reaches this machine."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _hostname(netloc: str) -> str:
    """`Host` header or origin netloc → its lower-case name, without port or IPv6 brackets."""
    name, _ = split_host_and_port(netloc.lower())
    return name.strip("[]")


def host_allowed(host_header: str, bind_host: str, allowed: Iterable[str]) -> bool:
    """DNS rebinding guard: a server bound to loopback answers only requests that name this
    machine (or a listed name); a server bound elsewhere answers any name unless names are
    listed. `*` in `allowed` allows any."""
    listed = {name.lower().strip("[]") for name in allowed}
    if "*" in listed:
        return True
    name = _hostname(host_header)
    if name in listed:
        return True
    if is_loopback(bind_host):
        return name in LOCAL_HOSTS
    return not listed or name in LOCAL_HOSTS


def origin_allowed(origin: str, allowed: Iterable[str], host_header: str | None = None) -> bool:
    """A browser page's Origin: allowed when it is the page this server served (same host and
    port as the request's `Host`), a page served from this machine, or listed in `allowed`
    (`*`: any). The rule is explicit, so it holds on every Tornado version."""
    listed = {o.rstrip("/").lower() for o in allowed}
    if "*" in listed or origin.rstrip("/").lower() in listed:
        return True
    try:
        parts = urlsplit(origin)
        host = parts.hostname
    except ValueError:
        return False
    if host_header is not None and parts.netloc.lower() == host_header.lower():
        return True
    return host in LOCAL_HOSTS
