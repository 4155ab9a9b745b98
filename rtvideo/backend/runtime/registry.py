"""The manager's table of live sessions, by correlation id, and its lock.

Apart from `manager.py` so that everything done under the manager's lock is in one place:
each method here takes the lock once, does its bookkeeping, and returns. Nothing here
calls into a session beyond `request_stop` (which takes none of a session's locks), and no
session lock is ever taken while this one is held: a session's stream and state locks come
first or not at all.
"""

from __future__ import annotations

import hmac
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from rtvideo.backend.runtime.session import Session

_ENDED_IDS_KEPT = 1024


def same_secret(expected: str, given: str | None) -> bool:
    """Whether `given` is the session's secret (constant time: no timing tells how much matched)."""
    if given is None:
        return False
    return hmac.compare_digest(expected.encode("utf-8", "surrogatepass"), given.encode("utf-8", "surrogatepass"))


@dataclass(frozen=True)
class Lookup:
    """What a later request of a sequence finds: its session (None when none is live), the
    request id of the one that ended there, and whether the request lacks the secret."""

    session: Session | None
    ended_id: str | None
    foreign: bool


class SessionTable:
    """One session per correlation id; never more than `max_sessions` at once.

    `_lock` is the manager's lock: it guards the dicts below and is never held while taking a
    session's lock (a session's end reports back through `ended` with its own locks held).
    """

    def __init__(self, max_sessions: int) -> None:
        self.max_sessions = max_sessions
        self._lock = threading.Lock()
        self._sessions: dict[int, Session] = {}
        # when each live session's sequence last had a request (time.monotonic()): Triton's idle clock
        self._last_request: dict[int, float] = {}
        # each live session's secret (docs/protocol.md §8): only requests that carry it reach it
        self._secrets: dict[int, str] = {}
        # request id and secret of ended sessions whose sequence is still open, so their
        # owner's late requests are answered with their request_id; bounded, dropped at sequence end
        self._ended_ids: OrderedDict[int, tuple[str, str]] = OrderedDict()

    def __len__(self) -> int:
        with self._lock:
            return len(self._sessions)

    def session_for(self, corrid: int) -> Session | None:
        """The live session of a correlation id, if any."""
        with self._lock:
            return self._sessions.get(corrid)

    def live(self) -> list[Session]:
        with self._lock:
            return list(self._sessions.values())

    def watched(self) -> list[tuple[Session, float | None]]:
        """Each live session with when its sequence last had a request (the watchdog's round)."""
        with self._lock:
            return [(s, self._last_request.get(c)) for c, s in self._sessions.items()]

    def lookup(self, corrid: int, secret: str | None, *, received: float, end: bool) -> Lookup:
        """A later request of a sequence. Any request restarts the mirror of Triton's idle clock;
        only one with the session's secret (or the ended session's) is the session's, and only
        such a sequence end forgets the ended session."""
        with self._lock:
            session = self._sessions.get(corrid)
            if session is not None:
                self._last_request[corrid] = received  # any request restarts Triton's idle clock
                expected: str | None = self._secrets.get(corrid)
                ended_id = None
            else:
                ended_id, expected = self._ended_ids.get(corrid, (None, None))
            if expected is not None and not same_secret(expected, secret):
                foreign = True
            else:
                foreign = False
                if end:
                    self._ended_ids.pop(corrid, None)
        return Lookup(session, ended_id, foreign)

    def live_secret(self, corrid: int) -> str | None:
        """The secret of the session still running on `corrid` (None when none runs there)."""
        with self._lock:
            live = self._sessions.get(corrid)
            return self._secrets.get(corrid) if live is not None and not live.ended else None

    def forget_ended(self, corrid: int) -> None:
        """Triton begins a new sequence: whatever ended on this id is gone."""
        with self._lock:
            self._ended_ids.pop(corrid, None)

    def place(self, corrid: int, secret: str, make: Callable[[], Session]) -> tuple[Session | None, int]:
        """Put a new session (`make`, called under the lock) on `corrid`, replacing (stopping) the
        one there; None when every slot is taken. Also the number of live sessions after."""
        with self._lock:
            previous = self._sessions.pop(corrid, None)  # a new START on a live sequence replaces it
            self._secrets.pop(corrid, None)
            self._last_request.pop(corrid, None)
            if previous is not None:
                previous.request_stop()
            if len(self._sessions) >= self.max_sessions:
                session = None
            else:
                session = self._sessions[corrid] = make()
                self._last_request[corrid] = time.monotonic()
                self._secrets[corrid] = secret
            return session, len(self._sessions)

    def drop(self, corrid: int, session: Session) -> None:
        """Take out a session whose start failed (if it is still the one on `corrid`)."""
        with self._lock:
            if self._sessions.get(corrid) is session:
                del self._sessions[corrid]
                self._secrets.pop(corrid, None)
                self._last_request.pop(corrid, None)

    def ended(self, corrid: int, session: Session) -> int:
        """A session ended: its slot is free, its request id and secret kept for the sequence's
        late requests. The number of live sessions after."""
        with self._lock:
            if self._sessions.get(corrid) is session:
                del self._sessions[corrid]
                self._last_request.pop(corrid, None)
                self._ended_ids[corrid] = (session.request_id, self._secrets.pop(corrid, ""))
                while len(self._ended_ids) > _ENDED_IDS_KEPT:
                    self._ended_ids.popitem(last=False)
            return len(self._sessions)
