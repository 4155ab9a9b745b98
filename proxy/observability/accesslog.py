"""The proxy's access log, with secrets kept out of it.

The demo page passes the bearer token as `?token=...` (a browser cannot set headers on a
WebSocket), guest and recording links carry theirs as `?watch_token=...` and the like, and
Tornado's own access line is `<status> <method> <uri> (<ip>) <ms>`: the tokens would land in
every log. `log_request` (the application's `log_function`) writes the same line with the value
of every secret query parameter masked: the names are `rtvideo.redaction.SECRET_PARAMS`, the one
list the URL parsing (`rtvideo.proxy.edge.access.query_value`) and docs/security.md share,
and any name that ends like a credential (`..._token`, `...key`). `SecretFilter`, on Tornado's
loggers, does the same to anything else they write (an uncaught exception names the URI), and
to `Bearer` credentials and URL passwords. Request headers are never logged.

Levels: below 400 INFO, except the probe endpoints (`/healthz`, `/readyz`, `/livez`,
`/metrics`: a load balancer polls them) at DEBUG; a 503 from a probe endpoint is INFO (the
supervisor logs the backend's state changes); other 4xx and 503 refusals (capacity, backend
down) WARNING; other 5xx ERROR.
"""

from __future__ import annotations

import logging
from typing import Any

from tornado.log import access_log

from rtvideo.redaction import SECRET_PARAMS, redact_path, redact_text, redact_uri

# SECRET_PARAMS and redact_text are rtvideo.redaction's, re-exported: what this log masks
__all__ = ["SECRET_PARAMS", "SecretFilter", "install_filter", "log_request", "redact", "redact_text"]

PROBE_PATHS = frozenset({"/healthz", "/readyz", "/livez", "/metrics"})


def redact(uri: str) -> str:
    """`uri` with the value of every secret query parameter (however its name is encoded) masked."""
    return redact_uri(uri)


def log_request(handler: Any) -> None:
    """One access line per finished request (and per WebSocket upgrade), secrets masked."""
    status = handler.get_status()
    request = handler.request
    probe = request.path in PROBE_PATHS
    if status < 400:
        level = logging.DEBUG if probe else logging.INFO
    elif status == 503:
        level = logging.INFO if probe else logging.WARNING
    elif status < 500:
        level = logging.WARNING
    else:
        level = logging.ERROR
    if access_log.isEnabledFor(level):
        access_log.log(
            level,
            "%d %s %s (%s) %.2fms",
            status,
            request.method,
            redact(redact_path(request.uri or "")),  # a broadcast's id is its capability
            request.remote_ip,
            1000.0 * request.request_time(),
        )


class SecretFilter(logging.Filter):
    """Masks secrets in every record of the logger it is on (the message is formatted here)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = redact_text(message)
        if cleaned != message:
            record.msg, record.args = cleaned, ()
        return True


def install_filter() -> None:
    """Put a `SecretFilter` on Tornado's loggers and on the root logger's handlers (once each):
    a logger's filter sees only what is logged on it, a handler's also what its children pass
    up, so every line the proxy writes (a library's exception that names a URL included) is
    masked, not only the lines written with `redact_url` in hand."""
    for name in ("tornado.access", "tornado.application", "tornado.general"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, SecretFilter) for f in logger.filters):
            logger.addFilter(SecretFilter())
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, SecretFilter) for f in handler.filters):
            handler.addFilter(SecretFilter())
