"""The proxy's access log, with secrets kept out of it.

The demo page passes the bearer token as `?token=...` (a browser cannot set headers on a
WebSocket), and Tornado's own access line is `<status> <method> <uri> (<ip>) <ms>`: the
token would land in every log. `log_request` (the application's `log_function`) writes the
same line with each `token` query value replaced by `***`; `SecretFilter`, on Tornado's
loggers, does the same to anything else they write (an uncaught exception names the URI),
and to `Bearer` credentials. Request headers are never logged.

Levels: below 400 INFO, except the probe endpoints (`/healthz`, `/readyz`, `/livez`,
`/metrics`: a load balancer polls them) at DEBUG; a 503 from a probe endpoint is INFO (the
supervisor logs the backend's state changes); other 4xx and 503 refusals (capacity, backend
down) WARNING; other 5xx ERROR.
"""

from __future__ import annotations

import logging
import re
from typing import Any
from urllib.parse import unquote_plus

from tornado.log import access_log

__all__ = ["SecretFilter", "install_filter", "log_request", "redact"]

#: query parameters whose value never reaches a log
SECRET_PARAMS = frozenset({"token", "watch_token", "steer_token", "recording_token"})  # links that carry a key
PROBE_PATHS = frozenset({"/healthz", "/readyz", "/livez", "/metrics"})
_MASK = "***"
_BEARER = re.compile(r"(?i)\b(bearer\s+)[^\s'\",;)]+")
_QUERY_SECRET = re.compile(
    r"(?i)([?&;](?:watch_|steer_|recording_)?(?:%74|t)(?:%6f|o)(?:%6b|k)(?:%65|e)(?:%6e|n)=)[^&\s'\"#;)]*"
)


def redact(uri: str) -> str:
    """`uri` with the value of every secret query parameter (however its name is encoded) masked."""
    path, sep, rest = uri.partition("?")
    if not sep:
        return uri
    query, hash_sep, fragment = rest.partition("#")
    parts = []
    for piece in query.split("&"):
        name, _eq, _value = piece.partition("=")
        parts.append(f"{name}={_MASK}" if unquote_plus(name).lower() in SECRET_PARAMS else piece)
    return f"{path}?{'&'.join(parts)}{hash_sep}{fragment}"


def redact_text(text: str) -> str:
    """Free text (a log message) with `token=` query values and `Bearer` credentials masked."""
    return _BEARER.sub(rf"\g<1>{_MASK}", _QUERY_SECRET.sub(rf"\g<1>{_MASK}", text))


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
            redact(request.uri or ""),
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
    """Put a `SecretFilter` on Tornado's loggers (once)."""
    for name in ("tornado.access", "tornado.application", "tornado.general"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, SecretFilter) for f in logger.filters):
            logger.addFilter(SecretFilter())
