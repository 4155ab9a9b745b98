"""The session store's interface, and what it holds of one session.

A session is kept as three parts, each written as it happens, so a replica that takes the
session over rebuilds it from them (rtvideo.proxy.session.record):

- its fields: the start as sent to the model, the model's `video.start` config (the seed),
  the request id, the position delivered (transport and generation index, frames, the init
  segment), the recording id, whether it may be resumed; `put` and `delivered` write them;
- its events: each interaction's payload as forwarded, by event id, written before its ack
  leaves (`add_event`), and where each started (`delivered`'s `started`);
- its tokens, hashed: token hash → session id (`bind_token`); never a token in clear.

One holder drives a session at a time: a lease with an expiry and an epoch (`acquire`,
`renew`, `release`). Every write names the lease it is made under and is refused (False)
once that lease is not the live one, so a replica that lost its lease cannot write, and
learns it at its next write or renewal. `ask_handoff` asks the live holder to let go (it
sees it at its next renewal).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

#: how long a lease lasts unless renewed: short enough that a client's own resume retries
#: (about 8 s) reach a replica that can take a dead holder's session over
LEASE_SECONDS = 3.0


class StoreUnavailable(Exception):
    """The store did not answer (or answered an error); the message says which call."""


@dataclass(frozen=True)
class Lease:
    """The right to drive one session: who holds it, and the epoch it was granted in."""

    holder: str
    epoch: int

    @property
    def value(self) -> str:
        return f"{self.holder}:{self.epoch}"


@dataclass(frozen=True)
class StoredSession:
    """One session as the store holds it."""

    sid: str
    fields: Mapping[str, str]
    events: Mapping[str, str] = field(default_factory=dict)  # event id → interaction payload (JSON)
    started: Mapping[str, str] = field(default_factory=dict)  # event id → "chunk,frame"
    holder: str | None = None  # the live lease's holder, if any


class SessionStore(Protocol):
    """Where sessions live beyond one proxy process."""

    #: whether other processes see it (Redis): then a shutdown closes clients with 1012
    shared: bool
    #: the token instance every replica of this store issues under (a token of any is found)
    cluster: str

    async def put(self, sid: str, lease: Lease, fields: Mapping[str, str]) -> bool: ...

    async def add_event(self, sid: str, lease: Lease, event_id: str, payload: str) -> bool: ...

    async def delivered(
        self, sid: str, lease: Lease, fields: Mapping[str, str], started: Mapping[str, str]
    ) -> bool: ...

    async def bind_token(self, kind: str, token_hash: str, sid: str) -> None: ...

    async def unbind_token(self, kind: str, token_hash: str) -> None: ...

    async def find(self, kind: str, token_hash: str) -> str | None: ...

    async def load(self, sid: str) -> StoredSession | None: ...

    async def acquire(self, sid: str, holder: str, ttl: float = LEASE_SECONDS) -> Lease | None: ...

    async def renew(self, sid: str, lease: Lease, ttl: float = LEASE_SECONDS) -> bool: ...

    async def release(self, sid: str, lease: Lease) -> None: ...

    async def ask_handoff(self, sid: str) -> None: ...

    async def drop(self, sid: str) -> None: ...

    async def close(self) -> None: ...
