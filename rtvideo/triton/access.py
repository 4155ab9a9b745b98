"""Who may talk to Triton: the access key and the small secrets of the Triton contract.

Triton's gRPC port serves more than inference: shared-memory registration, log settings,
model config, statistics, the model repository. Any of them in a stranger's hands is a
way to crash or blind the server (docs/security.md). `rtvideo serve` therefore starts
tritonserver with ``--grpc-restricted-protocol`` over every protocol group but ``health``
(probes stay open), keyed by one secret; every client of ours (the proxy, its
supervisor, the blocking client, the benchmarks, the tests) sends that secret as the
gRPC metadata header ``triton-grpc-protocol-rtvideo-key``.

Also here, because they are secrets of the same contract:

- the per-session secret that ``session.start`` carries in request parameter
  :data:`SESSION_SECRET_PARAMETER` and every later request of the sequence repeats;
- :func:`short_hash`, what logs show instead of correlation ids, secrets and prompts.

Standard library only: the model, the proxy and the clients all import it.
"""

from __future__ import annotations

import hashlib
import os
import secrets

#: the key Triton's restriction is named by; the client header is ``triton-grpc-protocol-<KEY_NAME>``
KEY_NAME = "rtvideo-key"

#: every protocol group of ``--grpc-restricted-protocol`` (Triton 2.51) but ``health``
RESTRICTED_GROUPS: tuple[str, ...] = (
    "metadata",
    "inference",
    "shared-memory",
    "model-config",
    "model-repository",
    "statistics",
    "trace",
    "logging",
)

#: the environment variable that carries the Triton key to our processes
KEY_ENV = "RTVIDEO_TRITON_KEY"

#: the gRPC request parameter holding a session's secret (docs/protocol.md §8)
SESSION_SECRET_PARAMETER = "rtvideo_session_secret"

_HEADER = f"triton-grpc-protocol-{KEY_NAME}"


def restricted_protocol_flag(key: str) -> str:
    """The one tritonserver flag that puts every group but health behind `key`.

    Triton's syntax is ``<group>[,<group>...]:<key>=<value>`` (a colon before the key)."""
    if not key or any(c.isspace() for c in key) or "=" in key:
        raise ValueError("the Triton key must be non-empty, without whitespace or '='")
    return f"--grpc-restricted-protocol={','.join(RESTRICTED_GROUPS)}:{KEY_NAME}={key}"


def restricted_http_flag(key: str) -> str:
    """The same restriction for Triton's HTTP endpoint, when it is open: HTTP clients send the
    header ``rtvideo-key: <key>`` (no ``triton-grpc-protocol-`` prefix there)."""
    return restricted_protocol_flag(key).replace("--grpc-restricted-protocol=", "--http-restricted-api=", 1)


def key_headers(key: str | None) -> dict[str, str]:
    """The gRPC metadata a client sends with every call: {} without a key."""
    if not key:
        return {}
    return {_HEADER: key}


def generate_key() -> str:
    """A fresh random key: 256 bits as hex, so that it never begins with `-` (a command line
    would read such a value as a flag) and travels in any header unquoted."""
    return secrets.token_hex(32)


def key_from_env() -> str | None:
    """The key in ``$RTVIDEO_TRITON_KEY``, or None when unset or empty."""
    value = os.environ.get(KEY_ENV, "").strip()
    return value or None


def new_session_secret() -> str:
    """A fresh per-session secret for ``session.start`` (32 URL-safe characters)."""
    return secrets.token_urlsafe(24)


def short_hash(value: object) -> str:
    """What logs show instead of a correlation id, a secret or a prompt: 12 hex chars of sha256."""
    return hashlib.sha256(str(value).encode("utf-8", "surrogatepass")).hexdigest()[:12]
