"""Who may connect and who may pull which lever: the Host the request names, the browser
Origin, the client's bearer token (`--token`), the operator's (`--admin-token`), and the
client address a request counts against (docs/security.md "Credentials").

Two kinds of credential, never interchangeable: a client's token opens sessions and the
routes a client uses; the operator's alone opens the levers that act on everyone (the drain,
the full recordings listing, deleting any recording). The operator's is taken from the
`Authorization` header only, never from a query string (which a page can put in a link)."""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Callable, Iterable
from urllib.parse import urlsplit

from tornado.httputil import HTTPServerRequest, split_host_and_port
from tornado.web import RequestHandler

from rtvideo.proxy.placement.addresses import client_address, trusted_networks
from rtvideo.redaction import QUERY_CREDENTIALS

#: names of this machine: pages served from them are local development pages
LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})


def bearer(request: HTTPServerRequest) -> str | None:
    """The `Authorization: Bearer` value, if the request has one."""
    scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
    presented = presented.strip()
    return presented if scheme.lower() == "bearer" and presented else None


def query_value(request: HTTPServerRequest, name: str) -> str | None:
    """The credential `name` of the request's query (its last value), if there is one. The only
    reader of query values in the proxy, and only for the names in `QUERY_CREDENTIALS` (the
    list the access log masks): a credential read here is never written in clear in a log."""
    if name not in QUERY_CREDENTIALS:
        raise ValueError(f"{name!r} is not a query credential (rtvideo.redaction.QUERY_CREDENTIALS)")
    values = request.query_arguments.get(name)
    return values[-1].decode("utf-8", "replace").strip() if values else None


def same_secret(presented: str | None, secret: str) -> bool:
    """Constant-time comparison of what a request presented with a configured secret."""
    return presented is not None and hmac.compare_digest(presented.encode("utf-8", "replace"), secret.encode())


def token_ok(request: HTTPServerRequest, token: str | None) -> bool:
    """`Authorization: Bearer <token>` or `?token=<token>`; anything passes when no token is set."""
    if token is None:
        return True
    return same_secret(bearer(request), token) or same_secret(query_value(request, "token"), token)


def is_operator(request: HTTPServerRequest, admin_token: str | None) -> bool:
    """Whether the request carries the operator's credential (`Authorization: Bearer` only)."""
    return admin_token is not None and same_secret(bearer(request), admin_token)


#: request bodies a page may send cross-origin without a CORS preflight (the Fetch standard's
#: CORS-safelisted Content-Types); no lever takes a body, so any body is refused
SIMPLE_BODY_TYPES = ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data")


def refused_unsafe_request(handler: RequestHandler, allowed_origins: Iterable[str]) -> bool:
    """Guards a state-changing request (POST, DELETE): a browser Origin that is not this server's
    page (`origin_allowed`) is 403, and a request with a body is 415 (no lever takes one; a page
    can send a text/plain or form body anywhere without a preflight). True when refused."""
    request = handler.request
    origin = request.headers.get("Origin")
    if origin is not None and not origin_allowed(origin, allowed_origins, request.host):
        handler.set_status(403)
        handler.finish({"error": "cross-origin requests may not change anything here"})
        return True
    if request.body or request.headers.get("Content-Type") or request.headers.get("Transfer-Encoding"):
        handler.set_status(415)
        handler.finish({"error": "this request takes no body"})
        return True
    return False


def refused_without_token(
    handler: RequestHandler, token: str | None, rejected: Callable[[str], None] | None = None
) -> bool:
    """Answer 401 with the Bearer challenge when the request lacks the token (`rejected` counts
    it, as the upgrades' refusals are); True when it was refused."""
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


def client_of(request: HTTPServerRequest, trusted_proxies: tuple[str, ...]) -> str:
    """The client address a request counts against (`client_address`: the peer, or what a
    trusted proxy reports in `X-Forwarded-For`)."""
    peer = str(request.remote_ip)
    return client_address(peer, request.headers.get("X-Forwarded-For"), trusted_networks(trusted_proxies))
