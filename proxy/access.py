"""Who may connect: bearer token and browser Origin policy (checked before the upgrade)."""

from __future__ import annotations

import hmac
from typing import Iterable
from urllib.parse import urlsplit

from tornado.httputil import HTTPServerRequest

#: browser origins on this machine are allowed by default (local development pages)
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


def origin_allowed(origin: str, allowed: Iterable[str]) -> bool:
    """A cross-origin browser page (same-origin pages never reach here, see Tornado's
    `check_origin`): allowed when it is served from this machine or listed in `allowed`."""
    listed = {o.rstrip("/").lower() for o in allowed}
    if "*" in listed or origin.rstrip("/").lower() in listed:
        return True
    try:
        host = urlsplit(origin).hostname
    except ValueError:
        return False
    return host in LOCAL_HOSTS
