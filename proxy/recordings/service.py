"""The proxy's recordings: its store, the one writer thread, and which sessions record.

Built once per proxy from its settings (`Recordings.create`; None when `--recordings` is
unset). A session records when the deployer records all (`--record-all`) or its start asked
(`"record": true`); `begin` gives it a `SessionRecorder` under a fresh id, and the recording's
token: the capability that reads, branches and deletes that recording (docs/security.md). The
token is handed to the session's owner alone and never kept: the manifest holds its SHA-256.

A session taken over from another proxy goes on with its recording under the same id
(`reopen`: rtvideo.proxy.recordings.reopen; docs/recordings.md "Recordings across replicas"):
its token, whose hash the session store keeps, opens it still.

Branches read a recording's log and video off the event loop, on `branch_reader`'s threads,
at most `MAX_BRANCHES` at once (`branch_gate`): a burst of branches of a large log cannot
stall the other sessions' streams.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

from rtvideo.proxy.continuity.record import SavedEvent, SavedFrame
from rtvideo.proxy.observability.metrics import ProxyMetrics
from rtvideo.proxy.recordings import ids
from rtvideo.proxy.recordings.backing import backing_for
from rtvideo.proxy.recordings.recorder import SessionRecorder, Takeover
from rtvideo.proxy.recordings.store import LEFTOVER_QUIET_SECONDS, Limits, RecordingStore, token_digest

log = logging.getLogger(__name__)

#: branches being prepared at once (their logs read and parsed, a first frame decoded); beyond, server_busy
MAX_BRANCHES = 4
#: threads that read and parse branched recordings
BRANCH_READERS = 2
#: threads on which taken-over recordings wait for the proxy that held them to close them
REOPEN_WAITERS = 2


class NoRoom(Exception):
    """No recording may begin: the live ones fill the store (`RecordingStore.reserve`)."""


class BranchesBusy(Exception):
    """`MAX_BRANCHES` branches are being prepared already."""


def new_token() -> str:
    """A recording token: 256 random bits. Not bound to this process: it opens the recording on
    any proxy that serves the store, before and after a restart."""
    return "rk1." + secrets.token_urlsafe(32)


class Recordings:
    def __init__(self, store: RecordingStore, *, record_all: bool, metrics: ProxyMetrics) -> None:
        self.store = store
        self.record_all = record_all
        self._metrics = metrics
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rtvideo-recordings")
        self._waiter = ThreadPoolExecutor(max_workers=REOPEN_WAITERS, thread_name_prefix="rtvideo-reopen")
        self._tidied = time.monotonic()  # the writer's: when leftovers were last closed
        self._indexed = False  # the writer's: the store's index was built
        self._live: set[SessionRecorder] = set()
        self.branch_reader = ThreadPoolExecutor(max_workers=BRANCH_READERS, thread_name_prefix="rtvideo-branches")
        self._branching = 0  # branches being prepared (the event loop's count)
        self._writer.submit(self._tidy)

    @classmethod
    def create(
        cls,
        location: str | None,
        *,
        max_bytes: int,
        max_age: float,
        record_all: bool,
        metrics: ProxyMetrics,
        per_recording: int = 0,
        max_count: int = 0,
    ) -> Recordings | None:
        if not location:
            return None
        limits = Limits(max_bytes=max_bytes, max_age=max_age, per_recording=per_recording, max_count=max_count)
        store = RecordingStore(backing_for(location), limits)
        return cls(store, record_all=record_all, metrics=metrics)

    def wants(self, asked: bool) -> bool:
        return self.record_all or asked

    def begin(self, received_at: float) -> tuple[SessionRecorder, str]:
        """A new recording and its token; NoRoom when the live recordings leave it no room. Its
        place is reserved now; it begins in the store only when its video.start goes out (a start
        refused before that records nothing)."""
        if not self.store.reserve():
            raise NoRoom(
                f"recordings: live recordings fill the store (--recordings-max-bytes {self.store.limits.max_bytes}, "
                f"{self.store.per_recording} bytes each at most; --recordings-max-count "
                f"{self.store.limits.max_count or 'unbounded'}); try again when one ends"
            )
        token = new_token()
        recorder = SessionRecorder(
            self.store,
            ids.new_id(),
            self._writer,
            self._metrics,
            received_at=received_at,
            on_end=self._ended,
            token_digest=token_digest(token),
            until_video_start=True,
        )
        self._live.add(recorder)
        return recorder, token

    def reopen(
        self, rid: str, log: Sequence[SavedEvent | SavedFrame], token_hash: str | None, *, holder_gone: bool
    ) -> SessionRecorder:
        """The recording `rid` of a session taken over from another proxy, going on here: it
        follows what is handed out from now on, written after what it holds and what the
        session store kept of the session (`log`) that it lacks. `holder_gone`: its last holder
        stopped renewing its lease (killed), so no wait for it to close the recording. A
        recording that cannot go on is logged and counted, and the session goes on unrecorded;
        MalformedId for an id that is none."""
        recorder = SessionRecorder(
            self.store,
            ids.check(rid),
            self._writer,
            self._metrics,
            received_at=time.monotonic(),
            on_end=self._ended,
            token_digest=token_hash,
            takeover=Takeover(tuple(log), holder_gone, self._waiter),
        )
        self._live.add(recorder)
        return recorder

    @contextmanager
    def branch_gate(self) -> Iterator[None]:
        """Held while one branch is prepared; BranchesBusy when `MAX_BRANCHES` are (event loop only)."""
        if self._branching >= MAX_BRANCHES:
            raise BranchesBusy(f"{MAX_BRANCHES} branches are being prepared; try again in a moment")
        self._branching += 1
        try:
            yield
        finally:
            self._branching -= 1

    @property
    def live(self) -> int:
        return len(self._live)

    def _ended(self, recorder: SessionRecorder) -> None:
        """A recording ended (on the writer thread): and now and then, what killed proxies left
        and has been quiet long enough is closed (docs/recordings.md "Recordings across replicas")."""
        self._live.discard(recorder)
        if time.monotonic() - self._tidied > LEFTOVER_QUIET_SECONDS:
            self._tidied = time.monotonic()
            self._tidy()

    def _tidy(self) -> None:
        """At start: index what earlier runs left (once), close what a killed proxy left, apply the
        bounds; later, the leftovers again (only what the index does not hold is read)."""
        try:
            if not self._indexed:
                self.store.index()
                self._indexed = True
            closed = self.store.close_leftovers()
            removed = self.store.evict()
        except Exception as exc:  # noqa: BLE001 - a store that cannot be read is logged, not fatal
            log.error("recordings: the store could not be tidied: %s", exc)
            return
        if closed or removed:
            log.info("recordings: %d left incomplete closed, %d evicted by the bounds", len(closed), len(removed))

    def close(self) -> None:
        """Finish what is queued (recordings of sessions that ended at the stop, taken-over ones
        whose wait is over), then stop."""
        self._waiter.shutdown(wait=True)
        self._writer.shutdown(wait=True)
        self.branch_reader.shutdown(wait=False, cancel_futures=True)
