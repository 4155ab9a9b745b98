"""Session state beyond one process (docs/operations.md "When a proxy dies"): a session store
behind one interface (`base.SessionStore`), in the process by default (`memory`), Redis for
replicas (`redis_store`), chosen by `--session-store` (`open_store`)."""

from __future__ import annotations

from rtvideo.proxy.store.base import SessionStore
from rtvideo.proxy.store.memory import MemoryStore


def open_store(spec: str) -> SessionStore:
    """`memory` (the default) or `redis://host:port/db` (`rediss://` with TLS)."""
    if spec == "memory":
        return MemoryStore()
    if spec.startswith(("redis://", "rediss://", "unix://")):
        from rtvideo.proxy.store.redis_store import RedisStore  # the `redis` extra: only when asked for

        return RedisStore(spec)
    raise ValueError(f"--session-store takes 'memory' or a redis:// URL, not {spec!r}")
