"""The session store in Redis (or Valkey), for replicas: `--session-store redis://host:port/db`.

Keys, under the prefix `rtvideo:` (one Redis may serve several deployments by database):
`s:{sid}` the fields (a hash, with `epoch` and `touched`), `f:{sid}` the log (a list), `p:{sid}`
the kept payloads (a hash, base64), `l:{sid}` the lease (`holder:epoch`, with an expiry),
`h:{sid}` a handoff request, `d:{sid}` one its holder declined (60 s), `k:{kind}:{hash}` a token's session, `a:{holder}` where a proxy is
reached by the other replicas (with an expiry it renews). Each write under a lease is one Lua script that checks
the lease first, so a replica that lost it writes nothing (base.py). Every key of a session, its
token bindings included, expires `keep_seconds` (the resume grace and the lease: the longest a
session nobody drives can still be resumed) after its holder's last write or renewal: a session
nobody drives is forgotten, whether or not its end could drop it.

A server that answers but refuses writes (full at its `maxmemory`: OOM; a read-only replica)
raises `StoreRefusing`; `ping` writes a small probe key, so it tells that state apart.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Mapping, Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import OutOfMemoryError, ReadOnlyError, RedisError

from rtvideo.proxy.store.base import (
    CALL_SECONDS,
    LEASE_SECONDS,
    Holding,
    Lease,
    Payload,
    Renewal,
    SessionGone,
    StoredSession,
    StoreRefusing,
    StoreUnavailable,
)

PREFIX = "rtvideo:"
#: how long a session's keys outlive its holder's last write or renewal, unless the proxy says
#: (its resume grace and the lease: `--resume-grace-seconds`'s default + LEASE_SECONDS)
KEEP_SECONDS = 30 + LEASE_SECONDS
#: the key `ping` writes (with a short expiry) to learn whether the server takes writes
PROBE_KEY = "probe"
#: log entries written by one call of a restore (a Lua call's arguments are bounded)
RESTORE_BATCH = 500

# KEYS[1] lease; ARGV[1] the lease value; then the writes. Returns 1 when written.
_GUARD = "if redis.call('get', KEYS[1]) ~= ARGV[1] then return 0 end\n"
_PUT = _GUARD + ("redis.call('hset', KEYS[2], unpack(ARGV, 3))\nredis.call('expire', KEYS[2], ARGV[2])\nreturn 1")
# KEYS: lease, log, payloads; ARGV: lease, keep, n entries, entries..., then index, data, forgotten...
_APPEND = _GUARD + (
    "local n = tonumber(ARGV[3])\n"
    "if n > 0 then redis.call('rpush', KEYS[2], unpack(ARGV, 4, 3 + n)) end\n"
    "if #ARGV > 3 + n then\n"
    "  redis.call('hset', KEYS[3], ARGV[4 + n], ARGV[5 + n])\n"
    "  for i = 6 + n, #ARGV do redis.call('hdel', KEYS[3], ARGV[i]) end\n"
    "  redis.call('expire', KEYS[3], ARGV[2])\n"
    "end\n"
    "redis.call('expire', KEYS[2], ARGV[2])\nreturn 1"
)
# a restore begins: the fields replace the record's (its epoch and last renewal kept), the log
# and payloads go, and the record is marked `restoring` until `_RESTORED` (a takeover waits)
_RESTORE = _GUARD + (
    "local e = redis.call('hget', KEYS[2], 'epoch')\n"
    "local t = redis.call('hget', KEYS[2], 'touched')\n"
    "redis.call('del', KEYS[2], KEYS[3], KEYS[4])\n"
    "redis.call('hset', KEYS[2], 'epoch', e or 0, 'touched', t or 0, 'restoring', '1')\n"
    "if #ARGV > 2 then redis.call('hset', KEYS[2], unpack(ARGV, 3)) end\n"
    "redis.call('expire', KEYS[2], ARGV[2])\nreturn 1"
)
_RESTORED = _GUARD + "redis.call('hdel', KEYS[2], 'restoring')\nreturn 1"
_NOW_MS = "local t = redis.call('time')\nlocal now = t[1] * 1000 + math.floor(t[2] / 1000)\n"
_ACQUIRE = _NOW_MS + (
    "if redis.call('exists', KEYS[1]) == 1 then return 0 end\n"
    "local e = redis.call('hincrby', KEYS[2], 'epoch', 1)\n"
    "redis.call('hdel', KEYS[2], 'released')\n"
    "redis.call('hset', KEYS[2], 'touched', now)\n"
    "redis.call('set', KEYS[1], ARGV[1] .. ':' .. e, 'PX', ARGV[2])\n"
    "redis.call('del', KEYS[3])\nreturn e"
)
# a handoff asked with the holder's live resume token ends the lease; one asked with an older
# token (the holder was resumed with it meanwhile: the other resume lost the race) is dropped
_RENEW = _NOW_MS + (
    "if redis.call('get', KEYS[1]) ~= ARGV[1] then return redis.call('exists', KEYS[3]) - 1 end\n"
    "local asked = 1\n"
    "local h = redis.call('get', KEYS[2])\n"
    "if h then\n  if h == ARGV[3] then asked = 2 else redis.call('del', KEYS[2]) end\nend\n"
    "redis.call('hset', KEYS[3], 'touched', now)\n"
    "redis.call('pexpire', KEYS[1], ARGV[2])\n"
    # the record and its token bindings live `keep` seconds past the last renewal (ARGV[4]):
    # a session whose chunks pause (a move, a detached owner) is not forgotten while driven
    "for i = 3, #KEYS do redis.call('expire', KEYS[i], ARGV[4]) end\n"
    "local tokens = redis.call('hget', KEYS[3], 'tokens')\n"
    "if tokens then for kind, h in pairs(cjson.decode(tokens)) do\n"
    "  redis.call('expire', ARGV[5] .. 'k:' .. kind .. ':' .. h, ARGV[4])\nend end\nreturn asked"
)
# KEYS: lease, handoff request, its answer; ARGV: lease, the resume hash it was asked with
_DECLINE = _GUARD + (
    "if redis.call('get', KEYS[2]) == ARGV[2] then\n"
    "  redis.call('del', KEYS[2])\n  redis.call('set', KEYS[3], ARGV[2], 'EX', 60)\nend\nreturn 1"
)
# KEYS: the session's s, f, p, l, h; ARGV: the lease's epoch and value ("": unfenced), prefix.
# Fenced: nothing is dropped once another holder acquired the session since (a later epoch)
_DROP = (
    "if ARGV[1] ~= '' then\n"
    "  local e = redis.call('hget', KEYS[1], 'epoch')\n"
    "  if e and e ~= ARGV[1] then return 0 end\n"
    "  local l = redis.call('get', KEYS[4])\n"
    "  if l and l ~= ARGV[2] then return 0 end\n"
    "end\n"
    "local tokens = redis.call('hget', KEYS[1], 'tokens')\n"
    "if tokens then for kind, h in pairs(cjson.decode(tokens)) do\n"
    "  local k = ARGV[3] .. 'k:' .. kind .. ':' .. h\n"
    "  if redis.call('get', k) == ARGV[4] then redis.call('del', k) end\nend end\n"
    "redis.call('del', unpack(KEYS))\nreturn 1"
)

# a released lease is marked on the session (a takeover tells a shutdown from a death)
_RELEASE = (
    "if redis.call('get', KEYS[1]) == ARGV[1] then\n  redis.call('del', KEYS[1])\n"
    "  if redis.call('exists', KEYS[2]) == 1 then redis.call('hset', KEYS[2], 'released', '1') end\nend\nreturn 1"
)


def _flat(fields: Mapping[str, str]) -> list[str]:
    return [x for pair in fields.items() for x in pair]


class RedisStore:
    """Sessions in a Redis server shared by every replica."""

    shared = True
    cluster = "shared"  # tokens of every replica look alike: the store, not the issuer, finds them

    def __init__(self, url: str, keep_seconds: float = KEEP_SECONDS) -> None:
        self._url = url
        self._keep = max(1, math.ceil(keep_seconds))  # seconds a session's keys outlive its last renewal
        self._redis: Any = aioredis.from_url(
            url, decode_responses=True, socket_timeout=CALL_SECONDS, socket_connect_timeout=CALL_SECONDS
        )
        self._scripts = {
            name: self._redis.register_script(src)
            for name, src in {
                "put": _PUT,
                "append": _APPEND,
                "acquire": _ACQUIRE,
                "renew": _RENEW,
                "release": _RELEASE,
                "drop": _DROP,
                "restore": _RESTORE,
                "decline": _DECLINE,
                "restored": _RESTORED,
            }.items()
        }

    async def _call(self, what: str, coro: Any) -> Any:
        try:
            return await coro
        except (OutOfMemoryError, ReadOnlyError) as exc:
            raise StoreRefusing(f"session store {what}: {exc}") from exc
        except (RedisError, OSError) as exc:
            raise StoreUnavailable(f"session store {what}: {exc}") from exc

    async def ping(self) -> None:
        await self._call("ping", self._redis.ping())
        await self._call("ping", self._redis.set(PREFIX + PROBE_KEY, "1", px=10_000))

    async def put(self, sid: str, lease: Lease, fields: Mapping[str, str]) -> bool:
        keys = [PREFIX + f"l:{sid}", PREFIX + f"s:{sid}"]
        args: list[str | int] = [lease.value, self._keep, *_flat(fields)]
        return bool(await self._call("put", self._scripts["put"](keys=keys, args=args)))

    async def append(self, sid: str, lease: Lease, entries: Sequence[str], payload: Payload | None) -> bool:
        keys = [PREFIX + f"l:{sid}", PREFIX + f"f:{sid}", PREFIX + f"p:{sid}"]
        args: list[str | int] = [lease.value, self._keep, len(entries), *entries]
        if payload is not None:
            args += [payload.index, base64.b64encode(payload.data).decode("ascii"), *payload.forget]
        return bool(await self._call("append", self._scripts["append"](keys=keys, args=args)))

    async def restore(
        self, sid: str, lease: Lease, fields: Mapping[str, str], log: Sequence[str], payloads: Mapping[int, bytes]
    ) -> bool:
        keys = [PREFIX + f"l:{sid}", PREFIX + f"s:{sid}", PREFIX + f"f:{sid}", PREFIX + f"p:{sid}"]
        args: list[str | int] = [lease.value, self._keep, *_flat(fields)]
        if not await self._call("restore", self._scripts["restore"](keys=keys, args=args)):
            return False
        for at in range(0, len(log), RESTORE_BATCH):
            if not await self.append(sid, lease, log[at : at + RESTORE_BATCH], None):
                return False
        for index, data in payloads.items():
            if not await self.append(sid, lease, (), Payload(index, data)):
                return False
        done = self._scripts["restored"](keys=keys[:2], args=[lease.value])
        return bool(await self._call("restore", done))

    async def bind_token(self, kind: str, token_hash: str, sid: str) -> None:
        await self._call("bind_token", self._redis.set(PREFIX + f"k:{kind}:{token_hash}", sid, ex=self._keep))

    async def unbind_token(self, kind: str, token_hash: str) -> None:
        await self._call("unbind_token", self._redis.delete(PREFIX + f"k:{kind}:{token_hash}"))

    async def find(self, kind: str, token_hash: str) -> str | None:
        found = await self._call("find", self._redis.get(PREFIX + f"k:{kind}:{token_hash}"))
        return None if found is None else str(found)

    async def load(self, sid: str) -> StoredSession | None:
        pipe = self._redis.pipeline(transaction=True)  # one moment's view of the session
        pipe.hgetall(PREFIX + f"s:{sid}")
        pipe.lrange(PREFIX + f"f:{sid}", 0, -1)
        pipe.hgetall(PREFIX + f"p:{sid}")
        pipe.get(PREFIX + f"l:{sid}")
        pipe.time()
        fields, log, payloads, lease, (seconds, micros) = await self._call("load", pipe.execute())
        now = int(seconds) * 1000 + int(micros) // 1000
        if not fields:
            return None
        holder = None if lease is None else str(lease).rsplit(":", 1)[0]
        age = max(0.0, (int(now) - int(fields.get("touched") or now)) / 1000)
        kept = {int(index): base64.b64decode(data) for index, data in payloads.items()}
        return StoredSession(sid, fields, log, kept, holder, age)

    async def acquire(self, sid: str, holder: str, ttl: float = LEASE_SECONDS) -> Lease | None:
        keys = [PREFIX + f"l:{sid}", PREFIX + f"s:{sid}", PREFIX + f"h:{sid}"]
        epoch = await self._call("acquire", self._scripts["acquire"](keys=keys, args=[holder, int(ttl * 1000)]))
        return Lease(holder, int(epoch)) if epoch else None

    async def renew(self, sid: str, lease: Lease, ttl: float = LEASE_SECONDS, resume_hash: str = "") -> Renewal:
        keys = [PREFIX + f"{part}:{sid}" for part in ("l", "h", "s", "f", "p")]
        args: list[str | int] = [lease.value, int(ttl * 1000), resume_hash, self._keep, PREFIX]
        renewed = await self._call("renew", self._scripts["renew"](keys=keys, args=args))
        if int(renewed) < 0:  # neither its lease nor its record: the store lost it (restarted empty)
            raise SessionGone(f"session store renew: session {sid} is gone from the store")
        return Renewal(int(renewed))

    async def release(self, sid: str, lease: Lease) -> None:
        keys = [PREFIX + f"l:{sid}", PREFIX + f"s:{sid}"]
        await self._call("release", self._scripts["release"](keys=keys, args=[lease.value]))

    async def ask_handoff(self, sid: str, resume_hash: str) -> None:
        await self._call("ask_handoff", self._redis.set(PREFIX + f"h:{sid}", resume_hash, ex=self._keep))

    async def decline_handoff(self, sid: str, lease: Lease, resume_hash: str) -> None:
        keys = [PREFIX + f"l:{sid}", PREFIX + f"h:{sid}", PREFIX + f"d:{sid}"]
        await self._call("decline_handoff", self._scripts["decline"](keys=keys, args=[lease.value, resume_hash]))

    async def handoff_declined(self, sid: str, resume_hash: str) -> bool:
        return await self._call("handoff_declined", self._redis.get(PREFIX + f"d:{sid}")) == resume_hash

    async def drop(self, sid: str, lease: Lease | None = None) -> None:
        keys = [PREFIX + f"{part}:{sid}" for part in ("s", "f", "p", "l", "h")]
        fence = ["", ""] if lease is None else [str(lease.epoch), lease.value]
        await self._call("drop", self._scripts["drop"](keys=keys, args=[*fence, PREFIX, sid]))

    async def holding(self, sid: str) -> Holding | None:
        pipe = self._redis.pipeline(transaction=True)
        pipe.exists(PREFIX + f"s:{sid}")
        pipe.hget(PREFIX + f"s:{sid}", "touched")
        pipe.get(PREFIX + f"l:{sid}")
        pipe.time()
        stored, touched, lease, (seconds, micros) = await self._call("holding", pipe.execute())
        if not stored:
            return None
        now = int(seconds) * 1000 + int(micros) // 1000
        holder = None if lease is None else str(lease).rsplit(":", 1)[0]
        return Holding(holder, max(0.0, (now - int(touched or now)) / 1000))

    async def advertise(self, holder: str, url: str, ttl: float) -> None:
        key = PREFIX + f"a:{holder}"
        if ttl <= 0:
            await self._call("advertise", self._redis.delete(key))
        else:
            await self._call("advertise", self._redis.set(key, url, px=max(1, int(ttl * 1000))))

    async def address(self, holder: str) -> str | None:
        found = await self._call("address", self._redis.get(PREFIX + f"a:{holder}"))
        return None if found is None else str(found)

    async def close(self) -> None:
        await self._redis.aclose()

    # --- the share of model slots each client holds (base.py) ------------------------------------
    # `c:{group}`: a sorted set of the group's sessions scored by their entry's expiry (the
    # store's clock, ms); expired entries are dropped before a count; the key itself expires with
    # its last entry.

    async def claim_share(self, group: str, member: str, limit: int, ttl: float) -> tuple[bool, int]:
        script = self._redis.register_script(_CLAIM_SHARE)
        keys, args = [PREFIX + f"c:{group}"], [member, limit, max(1, int(ttl * 1000))]
        counted, held = await self._call("claim_share", script(keys=keys, args=args))
        return bool(counted), int(held)

    async def renew_shares(self, entries: Sequence[tuple[str, str]], ttl: float) -> None:
        if not entries:
            return
        script = self._redis.register_script(_RENEW_SHARES)
        keys = [PREFIX + f"c:{group}" for group, _ in entries]
        args: list[str | int] = [max(1, int(ttl * 1000)), *(member for _, member in entries)]
        await self._call("renew_shares", script(keys=keys, args=args))

    async def release_share(self, group: str, member: str) -> None:
        await self._call("release_share", self._redis.zrem(PREFIX + f"c:{group}", member))

    async def shares(self, group: str) -> int:
        script = self._redis.register_script(_COUNT_SHARE)
        return int(await self._call("shares", script(keys=[PREFIX + f"c:{group}"], args=[])))


# the share of slots per client: KEYS[1] the group's sorted set, scored by each entry's expiry. A
# live entry expires after `now`; each script's first write is its ZADD, so a Redis at its
# `maxmemory` refuses the claim before it writes anything (a write first would let the rest pass).
# ARGV: member, limit, ttl (ms). Returns {counted, entries}
_CLAIM_SHARE = _NOW_MS + (
    "local live = redis.call('zcount', KEYS[1], now + 1, '+inf')\n"
    "local expiry = redis.call('zscore', KEYS[1], ARGV[1])\n"
    "local mine = expiry and tonumber(expiry) > now\n"
    "if not mine and live >= tonumber(ARGV[2]) then return {0, live} end\n"
    "redis.call('zadd', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])\n"
    "redis.call('zremrangebyscore', KEYS[1], '-inf', now)\n"
    "redis.call('pexpire', KEYS[1], ARGV[3])\n"
    "if mine then return {1, live} end\nreturn {1, live + 1}"
)
# KEYS: each entry's group key; ARGV: ttl (ms), then each entry's member
_RENEW_SHARES = _NOW_MS + (
    "for i = 1, #KEYS do\n"
    "  redis.call('zadd', KEYS[i], now + tonumber(ARGV[1]), ARGV[i + 1])\n"
    "  redis.call('pexpire', KEYS[i], ARGV[1])\n"
    "end\nreturn 1"
)
_COUNT_SHARE = _NOW_MS + "return redis.call('zcount', KEYS[1], now + 1, '+inf')"
