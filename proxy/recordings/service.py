"""The proxy's recordings: its store, the one writer thread, and which sessions record.

Built once per proxy from its settings (`Recordings.create`; None when `--recordings` is
unset). A session records when the deployer records all (`--record-all`) or its start asked
(`"record": true`); `begin` gives it a `SessionRecorder` under a fresh id.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

from prometheus_client import CollectorRegistry

from rtvideo.proxy.recordings import ids
from rtvideo.proxy.recordings.metrics import RecordingMetrics
from rtvideo.proxy.recordings.recorder import SessionRecorder
from rtvideo.proxy.recordings.store import Limits, RecordingStore, backing_for

log = logging.getLogger(__name__)


class Recordings:
    def __init__(self, store: RecordingStore, *, record_all: bool, metrics: RecordingMetrics) -> None:
        self.store = store
        self.record_all = record_all
        self._metrics = metrics
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rtvideo-recordings")
        self._live: set[SessionRecorder] = set()
        self._writer.submit(self._tidy)

    @classmethod
    def create(
        cls,
        location: str | None,
        *,
        max_bytes: int,
        max_age: float,
        record_all: bool,
        registry: CollectorRegistry | None,
    ) -> Recordings | None:
        if not location:
            return None
        store = RecordingStore(backing_for(location), Limits(max_bytes=max_bytes, max_age=max_age))
        return cls(store, record_all=record_all, metrics=RecordingMetrics(registry))

    def wants(self, asked: bool) -> bool:
        return self.record_all or asked

    def begin(self, received_at: float) -> SessionRecorder:
        recorder = SessionRecorder(
            self.store, ids.new_id(), self._writer, self._metrics, received_at=received_at, on_end=self._ended
        )
        self._live.add(recorder)
        return recorder

    @property
    def live(self) -> int:
        return len(self._live)

    def _ended(self, recorder: SessionRecorder) -> None:
        self._live.discard(recorder)

    def _tidy(self) -> None:
        """At start: close what a killed proxy left, apply the bounds."""
        try:
            closed = self.store.close_leftovers()
            removed = self.store.evict()
        except Exception as exc:  # noqa: BLE001 - a store that cannot be read is logged, not fatal
            log.error("recordings: the store could not be tidied: %s", exc)
            return
        if closed or removed:
            log.info("recordings: %d left incomplete closed, %d evicted by the bounds", len(closed), len(removed))

    def close(self) -> None:
        """Finish what is queued (recordings of sessions that ended at the stop), then stop."""
        self._writer.shutdown(wait=True)
