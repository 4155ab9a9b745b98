"""The tokens that let a participant attach to a live session: a resume token (a new owner,
rtvideo.proxy.session.resume) and a watch token (a watcher, rtvideo.proxy.participants.watchers).

Tokens: 256 random bits from `secrets`, prefixed with this proxy's instance id (random per
process, so a token of another replica, or of this proxy before a restart, is told apart
from a forged one); only their SHA-256 is held, and never logged. Each is bound to one
session. A token stops working when it is retired (used, expired, or its session ended);
the last few thousand such ends are remembered so that a refusal can say which.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from rtvideo.core.resume import ResumeRefused

#: random bytes in a token (256 bits)
TOKEN_BYTES = 32
#: how many used, expired or ended tokens are remembered, to say why one is refused
REMEMBERED_TOKENS = 4096

T = TypeVar("T")


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


@dataclass
class TokenBook(Generic[T]):
    """Tokens of one kind (`prefix`) issued by this proxy: digest → the session it opens."""

    prefix: str
    instance: str = field(default_factory=lambda: secrets.token_hex(8))
    _live: dict[bytes, T] = field(default_factory=dict)
    _ended: OrderedDict[bytes, str] = field(default_factory=OrderedDict)

    def issue(self, session: T) -> str:
        token = f"{self.prefix}.{self.instance}.{secrets.token_urlsafe(TOKEN_BYTES)}"
        self._live[_digest(token)] = session
        return token

    def adopt(self, token_hash: str, session: T) -> None:
        """A token another replica issued (known here by its hash, rtvideo.proxy.continuity.record)
        opens `session` now: this replica took the session over (shared instance only)."""
        self._live[bytes.fromhex(token_hash)] = session

    def retire(self, token: str | None, why: str) -> None:
        """The token no longer opens anything; `why` is what a later use is told."""
        if token is not None:
            self._retire(_digest(token), why)

    def retire_hash(self, token_hash: str | None, why: str) -> None:
        """`retire` for a token known by its hash alone (one `adopt`ed)."""
        if token_hash is not None:
            self._retire(bytes.fromhex(token_hash), why)

    def let_go(self, token: str | None) -> None:
        """The session `token` opens was handed to another replica: the token no longer opens
        anything here, and it is not ended either. A later use here is refused as an unknown
        token (`ResumeRefused.unknown`), so that, with a shared store, the store says where the
        session is: moving (retry) while this replica still releases its lease, then elsewhere.
        Retired instead ("the session has ended"), a guest that comes back here before the lease
        is released would be refused for good (403) while its session goes on elsewhere."""
        if token is not None:
            self._let_go(_digest(token))

    def let_go_hash(self, token_hash: str | None) -> None:
        """`let_go` for a token known by its hash alone (one `adopt`ed)."""
        if token_hash is not None:
            self._let_go(bytes.fromhex(token_hash))

    def _let_go(self, digest: bytes) -> None:
        self._live.pop(digest, None)
        self._ended.pop(digest, None)

    def _retire(self, digest: bytes, why: str) -> None:
        self._live.pop(digest, None)
        self._ended.setdefault(digest, why)  # the first end is the one a later use is told
        while len(self._ended) > REMEMBERED_TOKENS:
            self._ended.popitem(last=False)

    def find(self, token: str) -> T:
        """The session `token` opens, or ResumeRefused saying why not."""
        parts = token.split(".")
        if len(parts) != 3 or parts[0] != self.prefix:
            raise ResumeRefused("not a token of this server")
        if not hmac.compare_digest(parts[1], self.instance):
            raise ResumeRefused(
                "this token was issued by another proxy replica, or by this one before it restarted: "
                "a resume must reach the replica that holds the session (docs/operations.md)"
            )
        digest = _digest(token)
        session = self._live.get(digest)
        if session is not None:
            return session
        ended = self._ended.get(digest)
        raise ResumeRefused(ended or "unknown token", unknown=ended is None)

    def __len__(self) -> int:
        return len(self._live)
