"""Session state beyond one process (docs/operations.md "When a proxy dies"): a session store
behind one interface (`base.SessionStore`), in the process by default (`memory`), Redis for
replicas (`redis_store`), chosen by `--session-store` (`open_store`).

A store URL may carry a password (`redis://:PASSWORD@host:6379/0`): every message about one,
a malformed one's included, shows it through `rtvideo.redaction.redact_url`."""

from __future__ import annotations

from rtvideo.proxy.store.base import SessionStore
from rtvideo.proxy.store.memory import MemoryStore
from rtvideo.redaction import redact_text, redact_url

#: the schemes `--session-store` takes besides `memory` (Redis, Redis over TLS, a Unix socket)
REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


def check_store(spec: str) -> None:
    """Raise ValueError, the URL's password masked, unless `spec` is `memory` or a Redis URL that
    parses (nothing is connected to: settings are checked before anything starts)."""
    if spec == "memory":
        return
    if not spec.startswith(REDIS_SCHEMES):
        raise ValueError(f"--session-store takes 'memory' or a redis:// URL, not {redact_url(spec)!r}")
    try:
        from redis.asyncio import ConnectionPool  # the `redis` extra: only when asked for
    except ImportError:
        raise ValueError(
            f"--session-store {redact_url(spec)}: a Redis store needs redis (pip install 'rtvideo[redis]')"
        ) from None
    try:
        ConnectionPool.from_url(spec)  # parses the URL and its options; connects to nothing
    except (ValueError, TypeError) as exc:
        # `from None`: the traceback of the parse would show the URL (its locals, its message)
        raise ValueError(f"--session-store {redact_url(spec)}: {redact_text(str(exc))}") from None


def open_store(spec: str, keep_seconds: float | None = None) -> SessionStore:
    """`memory` (the default) or `redis://host:port/db` (`rediss://` with TLS); `keep_seconds`:
    how long a session's keys outlive its holder's last renewal (None: the store's default)."""
    check_store(spec)
    if spec == "memory":
        return MemoryStore()
    from rtvideo.proxy.store.redis_store import KEEP_SECONDS, RedisStore

    return RedisStore(spec, KEEP_SECONDS if keep_seconds is None else keep_seconds)
