"""The session store in the process (the default): one proxy, nothing to install.

It keeps the same parts and the same lease rules as the Redis store (base.py), so the proxy has
one code path; nothing outlives the process, and a shutdown ends sessions as it always did.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from rtvideo.proxy.store.base import LEASE_SECONDS, Holding, Lease, Payload, Renewal, SessionGone, StoredSession


@dataclass
class _Entry:
    fields: dict[str, str] = field(default_factory=dict)
    log: list[str] = field(default_factory=list)
    payloads: dict[int, bytes] = field(default_factory=dict)
    touched: float = 0.0
    epoch: int = 0
    lease: Lease | None = None
    expires: float = 0.0
    handoff: str | None = None  # the resume token hash a handoff was asked with
    declined: str | None = None  # the resume token hash a handoff was declined for


class MemoryStore:
    """Sessions in this process's memory."""

    shared = False

    def __init__(self) -> None:
        self.cluster = secrets.token_hex(8)
        self._sessions: dict[str, _Entry] = {}
        self._tokens: dict[tuple[str, str], str] = {}
        self._addresses: dict[str, tuple[str, float]] = {}  # holder → (url, expiry)
        self._shares: dict[str, dict[str, float]] = {}  # client group → session → expiry

    def _held(self, sid: str, lease: Lease) -> _Entry | None:
        entry = self._sessions.get(sid)
        if entry is None or entry.lease != lease or entry.expires < time.monotonic():
            return None
        return entry

    async def ping(self) -> None:
        return None

    async def put(self, sid: str, lease: Lease, fields: Mapping[str, str]) -> bool:
        entry = self._held(sid, lease)
        if entry is not None:
            entry.fields.update(fields)
        return entry is not None

    async def append(self, sid: str, lease: Lease, entries: Sequence[str], payload: Payload | None) -> bool:
        entry = self._held(sid, lease)
        if entry is None:
            return False
        entry.log.extend(entries)
        if payload is not None:
            entry.payloads[payload.index] = payload.data
            for index in payload.forget:
                entry.payloads.pop(index, None)
        return True

    async def restore(
        self, sid: str, lease: Lease, fields: Mapping[str, str], log: Sequence[str], payloads: Mapping[int, bytes]
    ) -> bool:
        entry = self._held(sid, lease)
        if entry is None:
            return False
        entry.fields, entry.log, entry.payloads = dict(fields), list(log), dict(payloads)
        return True

    async def bind_token(self, kind: str, token_hash: str, sid: str) -> None:
        self._tokens[(kind, token_hash)] = sid

    async def unbind_token(self, kind: str, token_hash: str) -> None:
        self._tokens.pop((kind, token_hash), None)

    async def find(self, kind: str, token_hash: str) -> str | None:
        return self._tokens.get((kind, token_hash))

    async def load(self, sid: str) -> StoredSession | None:
        entry = self._sessions.get(sid)
        if entry is None:
            return None
        holder = entry.lease.holder if entry.lease and entry.expires >= time.monotonic() else None
        age = time.monotonic() - entry.touched
        return StoredSession(sid, dict(entry.fields), list(entry.log), dict(entry.payloads), holder, age)

    async def acquire(self, sid: str, holder: str, ttl: float = LEASE_SECONDS) -> Lease | None:
        entry = self._sessions.setdefault(sid, _Entry())
        now = time.monotonic()
        if entry.lease is not None and entry.expires >= now:
            return None
        entry.epoch += 1
        entry.lease, entry.expires, entry.handoff = Lease(holder, entry.epoch), now + ttl, None
        entry.touched = now
        entry.fields.pop("released", None)
        return entry.lease

    async def renew(self, sid: str, lease: Lease, ttl: float = LEASE_SECONDS, resume_hash: str = "") -> Renewal:
        if sid not in self._sessions:
            raise SessionGone(f"session store renew: session {sid} is gone from the store")
        entry = self._held(sid, lease)
        if entry is None:
            return Renewal.LOST
        asked = entry.handoff is not None and entry.handoff == resume_hash
        if not asked:
            entry.handoff = None
        entry.touched = time.monotonic()
        entry.expires = entry.touched + ttl
        return Renewal.ASKED if asked else Renewal.RENEWED

    async def release(self, sid: str, lease: Lease) -> None:
        entry = self._sessions.get(sid)
        if entry is not None and entry.lease == lease:
            entry.lease = None
            entry.fields["released"] = "1"  # a takeover tells a shutdown from a death

    async def decline_handoff(self, sid: str, lease: Lease, resume_hash: str) -> None:
        entry = self._held(sid, lease)
        if entry is not None and entry.handoff == resume_hash:
            entry.handoff, entry.declined = None, resume_hash

    async def handoff_declined(self, sid: str, resume_hash: str) -> bool:
        entry = self._sessions.get(sid)
        return entry is not None and entry.declined == resume_hash

    async def ask_handoff(self, sid: str, resume_hash: str) -> None:
        entry = self._sessions.get(sid)
        if entry is not None:
            entry.handoff = resume_hash

    async def drop(self, sid: str, lease: Lease | None = None) -> None:
        entry = self._sessions.get(sid)
        if entry is not None and lease is not None and (entry.epoch != lease.epoch or entry.lease not in (None, lease)):
            return  # acquired by another since: not this caller's to drop
        self._sessions.pop(sid, None)
        for key in [k for k, v in self._tokens.items() if v == sid]:
            del self._tokens[key]

    async def holding(self, sid: str) -> Holding | None:
        stored = await self.load(sid)
        return None if stored is None else Holding(stored.holder, stored.age)

    async def advertise(self, holder: str, url: str, ttl: float) -> None:
        if ttl <= 0:
            self._addresses.pop(holder, None)
        else:
            self._addresses[holder] = (url, time.monotonic() + ttl)

    async def address(self, holder: str) -> str | None:
        url, expires = self._addresses.get(holder, ("", 0.0))
        return url if url and expires >= time.monotonic() else None

    async def close(self) -> None:
        self._sessions.clear()
        self._tokens.clear()
        self._addresses.clear()

    # --- the share of model slots each client holds (base.py) ------------------------------------
    def _share(self, group: str) -> dict[str, float]:
        """`group`'s live entries (member → expiry), the expired ones dropped."""
        now = time.monotonic()
        entries = {member: until for member, until in self._shares.get(group, {}).items() if until > now}
        if entries:
            self._shares[group] = entries
        else:
            self._shares.pop(group, None)
        return entries

    async def claim_share(self, group: str, member: str, limit: int, ttl: float) -> tuple[bool, int]:
        entries = self._share(group)
        if member not in entries and len(entries) >= limit:
            return False, len(entries)
        entries[member] = time.monotonic() + ttl
        self._shares[group] = entries
        return True, len(entries)

    async def renew_shares(self, entries: Sequence[tuple[str, str]], ttl: float) -> None:
        for group, member in entries:
            share = self._share(group)
            share[member] = time.monotonic() + ttl
            self._shares[group] = share

    async def release_share(self, group: str, member: str) -> None:
        self._share(group).pop(member, None)

    async def shares(self, group: str) -> int:
        return len(self._share(group))
