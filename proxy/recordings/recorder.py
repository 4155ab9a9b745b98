"""One session's recording: what the session hands its owner (a `RecordingSink`) and what its
participants send, written off the event loop.

- `video.mp4`: every binary payload handed to the owner, in transport order (the init segment
  first, the trailer last): the stream exactly as sent. A replayed frame (a resumed owner's,
  a watcher's) is never written twice: only first hand-outs reach a sink.
- `events.jsonl`: one line per JSON message, `{"t": seconds since the start was received,
  "dir": "in" | "out", "message": ...}`: what the owner sent and was handed, and what a guest
  steerer sent and was answered alone (those lines name the `participant`: `owner`,
  `steerer-1`, ... in the order they first spoke); a binary payload appears as its metadata
  message only. Only what a replay or a branch reads is logged, never a token
  (rtvideo.proxy.recordings.lines).
- `manifest.json`: the session (request id, model, the video.start config with its seed),
  times, counts and how it ended (`Manifest`).

A new session's recording begins in the store only when its `video.start` is handed out
(`until_video_start`): until then what it would write is held in memory, and a start refused
before it (by the proxy or the model) leaves nothing behind, not even a folder.

Writing never delays the stream: the loop only queues; one writer thread per store does the
I/O, charges every write to the store first (`RecordingStore.charge`), and flushes both files
after each write, so a killed proxy loses only what was queued (docs/recordings.md "Recordings
across replicas"). A recording that reaches its own cap, or finds the store full of live
recordings, is closed there as `truncated` (what it holds is kept, ending at a whole chunk). A recording whose queue grows
past `MAX_PENDING_BYTES` (a slow disk) or whose write fails (a full disk) is dropped: logged,
counted, its files removed, a manifest saying why left. Either way the session goes on.

A session taken over from another proxy goes on with its recording (`Takeover`): what is
handed out here is held until the old holder closed the recording (or is known gone), then
written after what the recording durably holds and what the session store kept that it lacks
(rtvideo.proxy.recordings.reopen), with times that go on from the recording's start.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import IO, Any

from rtvideo.proxy.continuity.record import SavedEvent, SavedFrame
from rtvideo.proxy.frames import Frame
from rtvideo.proxy.observability.metrics import ProxyMetrics
from rtvideo.proxy.recordings import reopen
from rtvideo.proxy.recordings.backing import EVENTS, VIDEO, open_private
from rtvideo.proxy.recordings.lines import encode, loggable
from rtvideo.proxy.recordings.store import TOKEN_DIGEST, Charge, RecordingStore

log = logging.getLogger(__name__)

#: bytes queued for the writer before the disk is deemed too slow and the recording dropped
MAX_PENDING_BYTES = 64 * 1024 * 1024
#: how often (in bytes written) a live recording's manifest (its size in the listing) is brought up to date
UPDATE_EVERY_BYTES = 16 * 1024 * 1024
#: how long a takeover waits for the proxy that handed the session off to close its recording
REOPEN_WAIT_SECONDS = 10.0


class RecordingState(Enum):
    RECORDING = "recording"
    COMPLETE = "complete"
    TRUNCATED = "truncated"  # closed at its cap or a full store; what it holds is kept
    FAILED = "failed"
    NOT_CONTINUED = "not continued"  # a takeover's: the recording stays as the old holder left it
    NOT_BEGUN = "not begun"  # the session ended before its video.start went out: nothing was recorded


@dataclass(frozen=True)
class Takeover:
    """A recording that goes on with its session, taken over from another proxy."""

    log: Sequence[SavedEvent | SavedFrame]  # the session's log as the session store kept it
    holder_gone: bool  # its last holder stopped renewing its lease: it will not close the recording
    waiter: Executor  # where the wait for the old holder runs (never the writer thread)


class Manifest:
    """What `manifest.json` says; built from the messages as they pass (pure)."""

    def __init__(self, rid: str, started_at: float, token_digest: str | None = None) -> None:
        self.fields: dict[str, Any] = {
            TOKEN_DIGEST: token_digest,
            "recording_id": rid,
            "status": RecordingState.RECORDING.value,
            "request_id": None,
            "model": None,
            "config": None,
            "started_at": started_at,
            "ended_at": None,
            "chunks": 0,
            "frames": 0,
            "bytes": 0,
            "ended": None,
        }

    def saw_out(self, message: Mapping[str, Any]) -> None:
        kind = message.get("type")
        if kind == "video.start":
            config = message.get("config") or {}
            self.fields.update(request_id=message.get("request_id"), model=config.get("model"), config=dict(config))
        elif kind == "video.chunk_metadata" and message.get("kind") == "media":
            self.fields["chunks"] += 1
            self.fields["frames"] += int(message.get("num_frames") or 0)
        elif kind == "session.done":
            self.fields["ended"] = {k: v for k, v in message.items() if not isinstance(v, list) and k != "type"}
        elif kind == "error" and self.fields["ended"] is None:
            self.fields["last_error"] = message.get("code")

    def snapshot(self, state: RecordingState, **extra: Any) -> dict[str, Any]:
        return {**self.fields, "status": state.value, **extra}

    def after(self, earlier: Manifest | None, manifest: dict[str, Any]) -> dict[str, Any]:
        """`manifest` (a snapshot of this one) of a recording that went on from `earlier`'s
        (a takeover): its start, token and counts from there on."""
        if earlier is None:
            return manifest
        before = earlier.fields
        out = {**manifest, "started_at": before["started_at"], TOKEN_DIGEST: before[TOKEN_DIGEST]}
        out.update(chunks=before["chunks"] + manifest["chunks"], frames=before["frames"] + manifest["frames"])
        for key in ("request_id", "model", "config"):
            out[key] = manifest[key] or before[key]
        return out


class SessionRecorder:
    """Records one session into `store` (see the module docstring). Called on the event loop;
    every write runs on `writer` (a one-thread executor shared by the store's recorders)."""

    def __init__(
        self,
        store: RecordingStore,
        rid: str,
        writer: Executor,
        metrics: ProxyMetrics,
        *,
        received_at: float,
        on_end: Callable[[SessionRecorder], None] | None = None,
        token_digest: str | None = None,
        takeover: Takeover | None = None,
        until_video_start: bool = False,
    ) -> None:
        self.rid = rid
        self._store = store
        self._writer = writer
        self._metrics = metrics
        self._t0 = received_at  # monotonic: when the session.start arrived
        self._manifest = Manifest(rid, time.time(), token_digest)
        self.state = RecordingState.RECORDING
        self._pending = 0  # bytes queued, not yet written (loop side; the lock guards it)
        self._lock = threading.Lock()
        self._files: dict[str, IO[bytes]] = {}
        self._spool: Path | None = None
        self._written = 0  # writer side: bytes written (charged to the store)
        self._written_since_update = 0
        self._closed = False  # writer side: finished or abandoned, nothing more to do
        self._on_end = on_end
        self._names: dict[int, str] = {}  # id(guest) → its name in the log (the guest outlives no session)
        self._guests: list[object] = []  # keeps each named guest alive, so its id is never reused
        #: writes held (in order) while a takeover waits for the old holder to close the recording
        self._held: list[Callable[[], None]] | None = None
        self._before: Manifest | None = None  # writer side: what the recording held when taken over
        self._t_shift: float | None = None  # writer side: this recorder's times → the recording's
        self._t_floor = 0.0  # writer side: the last time the recording held when taken over
        #: a new recording held (in memory, in order) until its session's video.start is handed
        #: out: a start refused before it leaves nothing in the store (`_begin_at_video_start`)
        self._awaiting_video_start = until_video_start and takeover is None
        if self._awaiting_video_start:
            self._held = []
        elif takeover is None:
            self._submit(self._open)
        else:
            self._held = []
            takeover.waiter.submit(self._await_holder, takeover)

    @property
    def request_id(self) -> str | None:
        return self._manifest.fields["request_id"]

    # --- the loop side -----------------------------------------------------------------------
    def received(self, message: Mapping[str, Any], sender: object | None) -> None:
        """A JSON message a participant sent (None: the owner), after the proxy parsed it."""
        kept = loggable(message, inbound=True)
        if kept is not None:
            self._line({"t": self._t(), "dir": "in", "participant": self._name(sender), "message": kept})

    def told(self, message: Mapping[str, Any], guest: object) -> None:
        """A message written to a guest steerer alone (its ack, its error)."""
        kept = loggable(message, inbound=False)
        if kept is not None:
            self._line({"t": self._t(), "dir": "out", "participant": self._name(guest), "message": kept})

    def _name(self, sender: object | None) -> str:
        if sender is None:
            return "owner"
        name = self._names.get(id(sender))
        if name is None:
            self._guests.append(sender)
            name = self._names[id(sender)] = f"steerer-{len(self._names) + 1}"
        return name

    def handed_out(self, frame: Frame) -> None:
        """A frame handed to the owner (`RecordingSink`)."""
        if self.state is not RecordingState.RECORDING:
            return
        message = loggable(frame.message, inbound=False)
        if message is None:
            return
        if self._awaiting_video_start and message.get("type") == "video.start":
            self._begin_at_video_start()
        self._manifest.saw_out(message)
        line = encode({"t": self._t(), "dir": "out", "message": message})
        writes = [(EVENTS, line)] if frame.data is None else [(EVENTS, line), (VIDEO, frame.data)]
        self._queue(writes)  # a chunk's metadata line and its payload are kept or refused together

    def _begin_at_video_start(self) -> None:
        """The session's video.start goes out: the recording begins in the store, with what was
        held for it (the start's line) first."""
        with self._lock:
            self._awaiting_video_start = False
            held, self._held = self._held or [], None
        for job in [self._open, *held]:
            self._submit(job)

    def _never_begun(self) -> None:
        """The session ended (or the recording was dropped) before its video.start: what was held
        goes, the store's place for it is given back, and nothing is written (the writer thread
        runs `_released`)."""
        with self._lock:
            self._awaiting_video_start = False
            self._held = None
        self.state = RecordingState.NOT_BEGUN
        self._submit(self._released)

    def _released(self) -> None:
        self._closed = True
        self._store.release()
        if self._on_end is not None:
            self._on_end(self)

    def session_ended(self) -> None:
        if self._awaiting_video_start:
            self._never_begun()
            return
        if self.state is not RecordingState.RECORDING:
            return
        self.state = RecordingState.COMPLETE
        manifest = self._manifest.snapshot(RecordingState.COMPLETE, ended_at=time.time())
        self._submit(lambda: self._finish(manifest))

    def _t(self) -> float:
        return round(time.monotonic() - self._t0, 6)

    def _line(self, entry: dict[str, Any]) -> None:
        if self.state is not RecordingState.RECORDING:
            return
        self._queue([(EVENTS, encode(entry))])

    def _queue(self, writes: list[tuple[str, bytes]]) -> None:
        size = sum(len(data) for _, data in writes)
        with self._lock:
            self._pending += size
            over = self._pending > MAX_PENDING_BYTES
        if over:
            self._drop(f"the store is too slow: more than {MAX_PENDING_BYTES} bytes wait to be written")
            return

        def job() -> None:
            try:
                self._append(writes)
            finally:
                with self._lock:
                    self._pending -= size

        self._submit(job)

    def _drop(self, reason: str) -> None:
        if self.state is not RecordingState.RECORDING:
            return
        if self._awaiting_video_start:  # nothing is in the store yet: nothing to leave there
            log.error("recording_id=%s not begun: %s", self.rid, reason)
            self._metrics.recording_failures.labels(reason.split(":")[0]).inc()
            self._never_begun()
            return
        self.state = RecordingState.FAILED
        log.error("recording_id=%s request_id=%s recording dropped: %s", self.rid, self.request_id, reason)
        self._metrics.recording_failures.labels(reason.split(":")[0]).inc()
        manifest = self._manifest.snapshot(RecordingState.FAILED, ended_at=time.time(), reason=reason)
        self._submit(lambda: self._abandon(manifest))

    def _submit(self, job: Callable[[], None]) -> None:
        with self._lock:
            if self._held is not None:
                self._held.append(job)
                return
            try:
                self._writer.submit(self._guarded, job)
            except RuntimeError:  # the writer is shut down (the proxy stops): nothing more is written
                self.state = RecordingState.FAILED

    # --- the writer thread ---------------------------------------------------------------------
    def _guarded(self, job: Callable[[], None]) -> None:
        try:
            job()
        except Exception as exc:  # noqa: BLE001 - a failed write drops the recording, never the session
            if self._closed:
                log.error("recording_id=%s: after the end: %s", self.rid, exc)
                return
            self.state = RecordingState.FAILED
            reason = f"write failed: {type(exc).__name__}: {exc}"
            log.error("recording_id=%s request_id=%s recording dropped: %s", self.rid, self.request_id, reason)
            self._metrics.recording_failures.labels("write failed").inc()
            try:
                self._abandon(self._manifest.snapshot(RecordingState.FAILED, ended_at=time.time(), reason=reason))
            except Exception as again:  # noqa: BLE001 - the store is gone: nothing is left to clean
                log.error("recording_id=%s: could not clean up: %s", self.rid, again)

    def _open(self) -> None:
        self._spool = self._store.begin(self.rid, self._marker(self._manifest.fields))
        self._store.update_live(self.rid, self._manifest.snapshot(RecordingState.RECORDING, bytes=0))

    @staticmethod
    def _marker(fields: Mapping[str, Any]) -> dict[str, Any]:
        return {key: fields[key] for key in ("recording_id", "started_at", TOKEN_DIGEST)}

    # --- a takeover (the waiter, then the writer thread) --------------------------------------
    def _await_holder(self, takeover: Takeover) -> None:
        """Once the old holder closed the recording (or is gone), the reopening is written
        first, then what was held meanwhile, in order."""
        try:
            if not takeover.holder_gone and not self._store.closed_by_holder(self.rid, REOPEN_WAIT_SECONDS):
                log.warning(
                    "recording_id=%s: its last holder did not close it within %g s; going on from what it wrote",
                    self.rid,
                    REOPEN_WAIT_SECONDS,
                )
        finally:
            with self._lock:
                held, self._held = self._held or [], None
                try:
                    for job in [lambda: self._reopen(takeover), *held]:
                        self._writer.submit(self._guarded, job)
                except RuntimeError:  # the proxy stops
                    self.state = RecordingState.FAILED

    def _reopen(self, takeover: Takeover) -> None:
        if self.state is RecordingState.FAILED:  # dropped while held: the recording stays as it was
            self._closed = True
            if self._on_end is not None:
                self._on_end(self)
            return
        try:
            found = reopen.prepare(self._store, self.rid, takeover.log, self._manifest.fields[TOKEN_DIGEST])
        except OSError as exc:  # before it is live here: the recording stays as it was
            found = f"it could not be read: {exc}"
        if isinstance(found, str):
            self._not_continued(found)
            return
        self._before = before = Manifest(self.rid, found.started_at, found.token_digest)
        for message in found.handed:
            before.saw_out(message)
        self._spool, self._written, self._t_floor = found.spool, found.size, found.last_t
        log.info(
            "recording_id=%s request_id=%s goes on here: %d bytes kept, %d written from the session store",
            self.rid,
            before.fields["request_id"],
            found.size,
            sum(len(data) for _, data in found.writes),
        )
        snapshot = self._manifest.snapshot(RecordingState.RECORDING, bytes=self._written)
        self._store.update_live(self.rid, self._manifest.after(before, snapshot))
        if found.writes:
            self._append(list(found.writes))
        self._t_shift = self._manifest.fields["started_at"] - found.started_at
        if found.lost_at is not None and not self._closed:
            lost = (
                f"its holder was killed before it wrote chunk {found.lost_at}, and the session store no longer kept it"
            )
            self._truncate(lost, counted=False)

    def _not_continued(self, why: str) -> None:
        self._closed = True
        self.state = RecordingState.NOT_CONTINUED
        log.warning("recording_id=%s not continued here (%s): the session goes on unrecorded", self.rid, why)
        self._metrics.recording_failures.labels("not continued").inc()
        if self._on_end is not None:
            self._on_end(self)

    def _shifted(self, line: bytes) -> bytes:
        """A line timed by this recorder, in the recording's time (never before what it held)."""
        assert self._t_shift is not None
        entry = json.loads(line)
        entry["t"] = round(max(self._t_floor, entry["t"] + self._t_shift), 6)
        return encode(entry)

    def _append(self, writes: list[tuple[str, bytes]]) -> None:
        if self._spool is None or self._closed or self.state is RecordingState.FAILED:
            return
        if self._t_shift is not None:
            writes = [(name, self._shifted(data) if name == EVENTS else data) for name, data in writes]
        size = sum(len(data) for _, data in writes)
        charged = self._store.charge(self.rid, [(name, len(data)) for name, data in writes])
        if charged is not Charge.OK:
            self._truncate(charged)
            return
        for name, data in writes:
            f = self._files.get(name)
            if f is None:
                f = self._files[name] = open_private(self._spool / name)
            f.write(data)
        self._flush_files()  # a killed proxy loses what was queued, never what was written
        self._written += size
        self._written_since_update += size
        if self._written_since_update >= UPDATE_EVERY_BYTES:
            self._written_since_update = 0
            snapshot = self._manifest.snapshot(RecordingState.RECORDING, bytes=self._written)
            self._store.update_live(self.rid, self._manifest.after(self._before, snapshot))

    def _truncate(self, why: Charge | str, counted: bool = True) -> None:
        """The store refused a write (or a takeover found a chunk lost): the recording is closed
        where it is, at a whole chunk (the session goes on). `counted`: what was handed out here
        so far is in it (a takeover's held frames are not)."""
        if isinstance(why, str):
            reason = why
        elif why is Charge.OVER_ITS_CAP:
            reason = f"the recording reached its cap (--recording-max-bytes {self._store.per_recording})"
        else:
            reason = f"live recordings fill the store (--recordings-max-bytes {self._store.limits.max_bytes})"
        self.state = RecordingState.TRUNCATED
        log.warning("recording_id=%s request_id=%s recording truncated: %s", self.rid, self.request_id, reason)
        self._metrics.recording_failures.labels("truncated").inc()
        manifest = self._manifest.snapshot(RecordingState.TRUNCATED, ended_at=time.time(), reason=reason)
        self._finish(manifest if counted else {**manifest, "chunks": 0, "frames": 0})

    def _flush_files(self) -> None:
        for f in self._files.values():
            f.flush()

    def _close_files(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()

    def _finish(self, manifest: dict[str, Any]) -> None:
        if self._closed or self.state is RecordingState.FAILED or self._spool is None:
            return
        self._close_files()
        manifest = {**self._manifest.after(self._before, manifest), "bytes": self._written}
        self._store.finish(self.rid, manifest)
        self._closed = True
        self._metrics.recording_written(int(manifest["bytes"]))
        log.info(
            "recording_id=%s request_id=%s recorded: %d chunks, %d bytes",
            self.rid,
            manifest["request_id"],
            manifest["chunks"],
            manifest["bytes"],
        )
        self._store.evict()
        if self._on_end is not None:
            self._on_end(self)

    def _abandon(self, manifest: dict[str, Any]) -> None:
        if self._closed:
            return
        self._closed = True
        self._close_files()
        self._store.abandon(self.rid, self._manifest.after(self._before, manifest))
        if self._on_end is not None:
            self._on_end(self)
