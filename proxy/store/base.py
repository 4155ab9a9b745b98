"""The session store's interface, and what it holds of one session.

A session is kept as parts written as they happen, so a replica that takes the session over
rebuilds it from them (rtvideo.proxy.continuity.record):

- its fields (`put`): the start as sent to the model (its seed pinned by the `video.start`
  kept beside it), the `video.start` as handed out without tokens, the options its start
  asked for, the stream's init segment, the recording id; `touched`, the store's clock at the
  holder's last renewal, is kept by the store itself;
- its log (`append`), in the order it happened: each interaction as forwarded (`e…`),
  written before its ack leaves, and each frame its owner's socket took (`f…`: acks, errors,
  chunk metadata), so the event book, the move log and the position are read back from it;
- the payloads of its last chunks handed out, by transport index (bounded by the keeper: what
  a resume after a takeover can be given again);
- its tokens, hashed: token hash → session id (`bind_token`); never a token in clear.

Beside the sessions, each proxy's own address (`advertise`, under its holder id, for as long as
it renews it): a replica that gets a watch or steer link of a session another live replica
holds forwards it there (rtvideo.proxy.edge.relay).

One holder drives a session at a time: a lease with an expiry and an epoch (`acquire`,
`renew`, `release`). Every write names the lease it is made under and is refused (False)
once that lease is not the live one, so a replica that lost its lease cannot write, and
learns it at its next write or renewal. `ask_handoff` asks the live holder to let go (it
sees it at its next renewal, `Renewal.ASKED`), naming the resume token it was asked with: a
holder resumed with that token meanwhile keeps the session (the other resume lost the race),
and a holder whose owner is attached and answering declines (`decline_handoff`: the resume is
refused as on one proxy, one controller at a time); else it finishes its writes and releases.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

#: how long a lease lasts unless renewed: short enough that a client's own resume retries
#: (about 8 s) reach a replica that can take a dead holder's session over
LEASE_SECONDS = 3.0
#: the longest one store call may take before the store is taken for away (an ack waits at most
#: this long for its write; docs/decisions.md "The session store under faults")
CALL_SECONDS = 2.0


class StoreUnavailable(Exception):
    """The store did not answer (or answered an error); the message says which call."""


class SessionGone(StoreUnavailable):
    """A renewal found neither the lease nor the record: the store lost the session (restarted
    empty, or its keys expired). Not a lost lease: nobody else holds it, its holder may write it
    again (rtvideo.proxy.store.keeper)."""


class StoreRefusing(StoreUnavailable):
    """The store answers but refuses writes: full (at its `maxmemory`) or read-only (a replica)."""


class Renewal(enum.IntEnum):
    """What a renewal found (true when the lease is renewed)."""

    LOST = 0  # not the live lease (lapsed, or another holder's): nothing renewed
    RENEWED = 1
    ASKED = 2  # renewed, and a resume elsewhere asks the holder to let go (with its live token)


@dataclass(frozen=True)
class Lease:
    """The right to drive one session: who holds it, and the epoch it was granted in."""

    holder: str
    epoch: int

    @property
    def value(self) -> str:
        return f"{self.holder}:{self.epoch}"


#: fields the store keeps of a session itself (beside those its holder puts)
STORE_FIELDS = frozenset({"epoch", "touched", "released", "restoring"})

#: a log entry's first character: an interaction as forwarded, or a frame the owner took
EVENT, FRAME = "e", "f"


@dataclass(frozen=True)
class Payload:
    """A chunk's payload to keep (by its transport index), and the older ones to forget."""

    index: int
    data: bytes
    forget: Sequence[int] = ()


@dataclass(frozen=True)
class StoredSession:
    """One session as the store holds it."""

    sid: str
    fields: Mapping[str, str]
    log: Sequence[str] = ()  # EVENT or FRAME, then the message's JSON text, in order
    payloads: Mapping[int, bytes] = field(default_factory=dict)  # transport index → payload
    holder: str | None = None  # the live lease's holder, if any
    age: float = 0.0  # seconds since the holder's last renewal (by the store's clock)


@dataclass(frozen=True)
class Holding:
    """Who drives a session now (None: nobody), and seconds since its holder last renewed."""

    holder: str | None
    age: float


class SessionStore(Protocol):
    """Where sessions live beyond one proxy process."""

    #: whether other processes see it (Redis): then a shutdown closes clients with 1012
    shared: bool
    #: the token instance every replica of this store issues under (a token of any is found)
    cluster: str

    async def ping(self) -> None:
        """Returns when the store answers and takes a write; StoreRefusing when it answers but
        refuses writes (full, read-only), StoreUnavailable when it does not answer."""
        ...

    async def put(self, sid: str, lease: Lease, fields: Mapping[str, str]) -> bool: ...

    async def append(self, sid: str, lease: Lease, entries: Sequence[str], payload: Payload | None) -> bool: ...

    async def restore(
        self, sid: str, lease: Lease, fields: Mapping[str, str], log: Sequence[str], payloads: Mapping[int, bytes]
    ) -> bool:
        """The whole record of a session written again under `lease` (its holder kept it while the
        store was away, or the store lost it): fields, log and payloads replace what is stored.
        While it is written the record is marked `restoring`, so a takeover never reads half of it.
        False when `lease` is not the live one."""
        ...

    async def bind_token(self, kind: str, token_hash: str, sid: str) -> None: ...

    async def unbind_token(self, kind: str, token_hash: str) -> None: ...

    async def find(self, kind: str, token_hash: str) -> str | None: ...

    async def load(self, sid: str) -> StoredSession | None: ...

    async def acquire(self, sid: str, holder: str, ttl: float = LEASE_SECONDS) -> Lease | None: ...

    async def renew(self, sid: str, lease: Lease, ttl: float = LEASE_SECONDS, resume_hash: str = "") -> Renewal:
        """LOST when `lease` is not the live one; ASKED (renewed) when a resume with the holder's
        live resume token (`resume_hash`) asked for a handoff; a handoff asked with an older token
        (one the holder was resumed with meanwhile) is dropped, and the lease renewed. SessionGone
        when neither the lease nor the record is there."""
        ...

    async def release(self, sid: str, lease: Lease) -> None: ...

    async def ask_handoff(self, sid: str, resume_hash: str) -> None: ...

    async def decline_handoff(self, sid: str, lease: Lease, resume_hash: str) -> None:
        """The holder (under `lease`) keeps the session a resume with `resume_hash` asked for: the
        request is dropped, and the resume that asked learns it (`handoff_declined`)."""
        ...

    async def handoff_declined(self, sid: str, resume_hash: str) -> bool:
        """Whether the holder declined the handoff asked with `resume_hash` (its owner answers)."""
        ...

    async def drop(self, sid: str, lease: Lease | None = None) -> None:
        """The session's record and the token bindings it names go; with `lease`, only when nobody
        acquired the session since that lease was granted (a record another replica holds stays)."""
        ...

    async def holding(self, sid: str) -> Holding | None:
        """`load`'s holder and age alone, without the log (None: the session is not stored)."""
        ...

    async def advertise(self, holder: str, url: str, ttl: float) -> None:
        """Where the proxy `holder` is reached by the other replicas (`http://host:port`), for
        `ttl` seconds unless advertised again; a `ttl` of 0 or less withdraws it."""
        ...

    async def address(self, holder: str) -> str | None:
        """The URL `holder` advertised and still renews (None: it never did, withdrew, or stopped)."""
        ...

    async def close(self) -> None: ...

    # --- the share of model slots each client holds, counted by every replica ------------------
    # A client (`ProxySettings.client_group`) holds a bounded share of the model's slots; each of
    # its sessions is an entry under its group that lives `ttl` seconds unless renewed, so a
    # replica that dies stops counting within `ttl`, and only live entries count.

    async def claim_share(self, group: str, member: str, limit: int, ttl: float) -> tuple[bool, int]:
        """Counts `member` (a session) against `group` for `ttl` seconds when the group's live
        entries are fewer than `limit` or `member` is one of them: (True, entries now); else
        (False, entries). One atomic step: two replicas cannot both take a client's last place."""
        ...

    async def renew_shares(self, entries: Sequence[tuple[str, str]], ttl: float) -> None:
        """Each `(group, member)` counted `ttl` seconds more (again, if it had expired meanwhile)."""
        ...

    async def release_share(self, group: str, member: str) -> None:
        """`member` no longer counts against `group` (its session ended here)."""
        ...

    async def shares(self, group: str) -> int:
        """How many live entries `group` holds."""
        ...
