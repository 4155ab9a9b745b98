"""Secrets kept out of what is shown: the one list of the credential names the product knows, and
the helpers that mask them in a URL, a request URI and free text (docs/security.md "Secrets in
URLs and logs").

Everything that shows a URL the operator gave (a `--session-store` Redis URL, a `--recordings`
fsspec URL, an OTLP endpoint) shows `redact_url(url)`; the proxy's access log shows request URIs
through `redact_uri`; `redact_text` masks what else may carry one (an exception's message, a
log line of a library). Pure functions, no I/O: nothing here can fail on a malformed URL, so the
message about a malformed URL is never the place its password leaks.
"""

from __future__ import annotations

import re
from urllib.parse import unquote_plus

__all__ = [
    "CAPABILITY_PATHS",
    "GENERIC_SECRET_PARAMS",
    "MASK",
    "NEVER_IN_QUERY",
    "QUERY_CREDENTIALS",
    "SECRET_PARAMS",
    "is_secret_param",
    "redact_path",
    "redact_text",
    "redact_uri",
    "redact_url",
]

MASK = "***"

#: the credentials the proxy takes from a URL's query: the client token (a browser cannot set
#: headers on a WebSocket), the guest links' tokens and a recording's token (links are shared as
#: URLs). Each is read through `rtvideo.proxy.edge.access.query_value`, which takes no other.
QUERY_CREDENTIALS = ("token", "watch_token", "steer_token", "recording_token")
#: the product's other credentials: never taken from a URL (the operator's credential and Triton's
#: key come as a header, a resume token in a frame), but a page or a script may still put one in a
#: URL by mistake, so a log masks them too
NEVER_IN_QUERY = ("admin_token", "resume_token", "triton_key", "rtvideo-key")
#: names that carry a credential in URLs the product is given (fsspec and presigned object-store
#: URLs, Redis URL options): masked wherever a URL is shown
GENERIC_SECRET_PARAMS = (
    "key",
    "access_key",
    "secret",
    "secret_key",
    "password",
    "passwd",
    "api_key",
    "x-amz-credential",
    "x-amz-signature",
    "x-amz-security-token",
    "sig",
    "signature",
    "credential",
)
#: every query parameter name whose value is never shown (the access log's `SECRET_PARAMS`)
SECRET_PARAMS = frozenset(QUERY_CREDENTIALS + NEVER_IN_QUERY + GENERIC_SECRET_PARAMS)
#: a name ending so is taken for a credential too, so that a new one is masked before it is listed
_SECRET_SUFFIXES = ("token", "key", "secret", "password", "passwd", "signature", "credential", "sig")

_BEARER = re.compile(r"(?i)\b(bearer\s+)[^\s'\",;)]+")
#: `name=value` where name (or its percent-encoding, letter by letter) ends like a credential
_ENC = {c: f"(?:%{ord(c):02x}|{c})" for c in "abcdefghijklmnopqrstuvwxyz_-"}
_NAME_TAIL = "|".join("".join(_ENC.get(c, re.escape(c)) for c in suffix) for suffix in _SECRET_SUFFIXES)
_QUERY_SECRET = re.compile(rf"(?i)([?&;][^=&\s'\"#;?]*?(?:{_NAME_TAIL})=)[^&\s'\"#;)]*")
#: `scheme://userinfo@`: a URL's user and password (masked as `redact_url` masks them)
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)([^/\s@'\"]*)@")


def is_secret_param(name: str) -> bool:
    """Whether a query parameter `name` (percent-decoded or not) carries a credential: one the
    product knows (`SECRET_PARAMS`) or one named like one (`..._token`, `...key`, `password`)."""
    plain = unquote_plus(name).strip().lower()
    return plain in SECRET_PARAMS or plain.endswith(_SECRET_SUFFIXES)


def _redact_query(query: str) -> str:
    pieces = []
    for piece in query.split("&"):
        name, eq, _value = piece.partition("=")
        pieces.append(f"{name}={MASK}" if eq and is_secret_param(name) else piece)
    return "&".join(pieces)


def redact_uri(uri: str) -> str:
    """A request URI (`/path?query#fragment`) with the value of every secret query parameter
    masked, however its name is encoded; the rest as it was."""
    path, sep, rest = uri.partition("?")
    if not sep:
        return uri
    query, hash_sep, fragment = rest.partition("#")
    return f"{path}?{_redact_query(query)}{hash_sep}{fragment}"


def _masked_userinfo(userinfo: str) -> str:
    user, colon, _password = userinfo.partition(":")
    return f"{user}:{MASK}" if colon else MASK


def redact_url(url: str) -> str:
    """`url` as it may be shown: its password masked (`redis://user:***@host:6379/0`; a userinfo
    with no `:`, which Redis takes for a password, masked whole) and its secret query values
    masked. Never raises, whatever `url` is (a malformed port, an unclosed `[`)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return redact_uri(url)
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    netloc, tail = rest[:end], rest[end:]
    userinfo, at, host = netloc.rpartition("@")
    if at:
        netloc = f"{_masked_userinfo(userinfo)}@{host}"
    return f"{scheme}://{netloc}{redact_uri(tail)}"


def redact_text(text: str) -> str:
    """Free text (a log message, an exception's message) with secret query values, the userinfo
    of URLs and `Bearer` credentials masked."""
    text = _QUERY_SECRET.sub(rf"\g<1>{MASK}", text)
    text = _USERINFO.sub(lambda m: f"{m[1]}{_masked_userinfo(m[2])}@", text)
    return _BEARER.sub(rf"\g<1>{MASK}", text)


#: path prefixes whose next segment is itself a capability (a broadcast's unguessable id,
#: rtvideo.proxy.broadcasts): masked wherever a request's path is shown
CAPABILITY_PATHS = ("/v1/broadcasts",)


def redact_path(uri: str) -> str:
    """`uri` with the capability segment after a `CAPABILITY_PATHS` prefix masked."""
    for prefix in CAPABILITY_PATHS:
        if uri.startswith(prefix + "/"):
            _, slash, tail = uri[len(prefix) + 1 :].partition("/")
            return f"{prefix}/{MASK}{slash}{tail}"
    return uri
