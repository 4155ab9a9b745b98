"""One session's invitations to participants other than its first owner (docs/protocol.md §9):
the options its start asked for, the tokens it handed out, the replay buffer behind a resume
token, the watchers' hub behind a watch token, the steerers' hub behind a steer token, and
the grace a detached session waits for its resume; and its recording, when the start asked
for one or the proxy records all (rtvideo.proxy.recordings), which hears every message in
and out (`heard`, `told`, and the handouts it follows).

A token is used once for a resume: each attach hands out a fresh one. Every token stops
working when the grace is over or the session ends; the steer token also when the owner
revokes steering (it is never handed out again for that session).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from rtvideo.core import server_messages
from rtvideo.core.chunks import MEDIA
from rtvideo.core.errors import ErrorCode, ProtocolError
from rtvideo.core.resume import ResumeRefused
from rtvideo.proxy.broadcasts.service import NoBroadcastRoom
from rtvideo.proxy.broadcasts.writer import BroadcastWriter
from rtvideo.proxy.continuity.record import SavedFrame, SavedSession, token_hash
from rtvideo.proxy.frames import Frame
from rtvideo.proxy.observability.metrics import ProxyMetrics
from rtvideo.proxy.participants.features import (
    Features,
    OwnerProbe,
    Resumable,
    SteerDoor,
    SteeringFrames,
    WatchDoor,
    take_options,
)
from rtvideo.proxy.participants.handouts import Handouts
from rtvideo.proxy.participants.links import Guest, Owner
from rtvideo.proxy.participants.replay import ReplayBuffer, ReplayGap
from rtvideo.proxy.participants.steerers import SteerHub
from rtvideo.proxy.participants.watchers import WatchHub
from rtvideo.proxy.recordings.branch import Branch, branch_start, take_branch
from rtvideo.proxy.recordings.ids import MalformedId
from rtvideo.proxy.recordings.recorder import SessionRecorder
from rtvideo.proxy.recordings.service import NoRoom
from rtvideo.proxy.settings import ProxySettings

log = logging.getLogger(__name__)


class Attachable(OwnerProbe, WatchDoor, SteerDoor, Protocol):
    """The session's attachments, as its tokens open them."""


class Joinable(Protocol):
    """A session its tokens open (`Resumable`, `Watchable` and `Steerable` at once)."""

    @property
    def attachments(self) -> Attachable: ...

    @property
    def steering(self) -> SteeringFrames: ...

    def attach_owner(self, owner: Owner, last: int, token: str) -> None: ...


class Invitations:
    """The resume and watch tokens of one session, and what stands behind them."""

    def __init__(self, features: Features | None, settings: ProxySettings, metrics: ProxyMetrics) -> None:
        self._features = features  # None: a proxy without resume and watching
        self._settings = settings
        self._metrics = metrics
        self._options: dict[str, bool] = {}  # the start's proxy options (resumable, watchable)
        self._resume_token: str | None = None  # the live one (never logged)
        self._watch_token: str | None = None
        self._replay: ReplayBuffer | None = None  # what the owner was handed, for a resume
        self._hub: WatchHub | None = None
        self._steer_token: str | None = None
        self._steer_hub: SteerHub | None = None
        self._grace_timer: asyncio.TimerHandle | None = None
        self._detached_counted = False  # counted in the detached-sessions gauge
        self._recorder: SessionRecorder | None = None
        self._recording_token: str | None = None  # the recording's capability: the owner's alone (never logged)
        self._branch: Branch | None = None  # the start's from_recording
        self._broadcast: BroadcastWriter | None = None  # the start's "broadcast": true (rtvideo.proxy.broadcasts)
        #: tokens of a session taken over from another replica, known here by their hash alone
        self._adopted: dict[str, str] = {}

    @property
    def enabled(self) -> bool:
        return self._features is not None

    @property
    def hub(self) -> WatchHub | None:
        return self._hub

    @property
    def steer_hub(self) -> SteerHub | None:
        return self._steer_hub

    @property
    def resumable(self) -> bool:
        """Whether a dropped owner detaches (its resume token is live and the grace is not 0)."""
        return self._resume_token is not None and self._features is not None and self._features.resume_grace > 0

    @property
    def asks_resume(self) -> bool:
        """Whether the start asked to be resumable (known from the start on, before its token
        exists): only such a session promises that a takeover knows its acked interactions."""
        return bool(self._options.get("resumable")) and self._features is not None and self._features.resume_grace > 0

    def take_options(self, first: dict[str, Any], raw: bytes, handouts: Handouts) -> bytes:
        """The start without the proxy's own options (the model never sees them); a recording
        begins here when one is wanted (so a start the model refuses is recorded too)."""
        if self._features is None:
            return raw  # a proxy without the features: the model refuses unknown fields as ever
        start = dict(first)
        self._branch = take_branch(first)
        self._options, raw = take_options(first, raw)
        if self._features.shared:  # with a shared store a deploy must lose no session that did not opt out
            self._options.setdefault("resumable", True)
        self._begin_broadcast(handouts)
        recordings = self._features.recordings
        asked = self._options.get("record", False)
        if recordings is None and asked:
            raise ProtocolError(
                ErrorCode.INVALID_START, "record: recordings are off on this server (rtvideo serve --recordings DIR)"
            )
        if recordings is not None and recordings.wants(asked):
            try:
                self._recorder, self._recording_token = recordings.begin(received_at=time.monotonic())
            except NoRoom as exc:
                if asked:  # the client asked for a recording it cannot have: said before anything starts
                    raise ProtocolError(ErrorCode.SERVER_BUSY, str(exc)) from None
                log.warning("session not recorded (--record-all): %s", exc)
                return raw
            self._recorder.received(start, None)
            handouts.record_to(self._recorder)
        return raw

    def _begin_broadcast(self, handouts: Handouts) -> None:
        """The start's `"broadcast": true`: its writer follows what the owner is handed (it
        begins on the store with video.start). Refused before anything starts when broadcasts
        are off (invalid_start) or this proxy holds its most (server_busy)."""
        assert self._features is not None
        if not self._options.get("broadcast"):
            return
        broadcasts = self._features.broadcasts
        if broadcasts is None:
            raise ProtocolError(
                ErrorCode.INVALID_START,
                "broadcast: broadcasts are off on this server (rtvideo serve --broadcast-store DIR|URL)",
            )
        try:
            self._broadcast = broadcasts.begin()
        except NoBroadcastRoom as exc:
            raise ProtocolError(ErrorCode.SERVER_BUSY, str(exc)) from None
        handouts.record_to(self._broadcast)

    @property
    def broadcast_id(self) -> str | None:
        """The session's broadcast (the session store keeps it: a takeover goes on with it)."""
        return None if self._broadcast is None else self._broadcast.bid

    def end_broadcast(self) -> asyncio.Future[str] | None:
        """The owner's `session.broadcast` {"enabled": false}: the playlist ends (EXT-X-ENDLIST),
        the session goes on. Returns its broadcast_url once the ended playlist is written (None:
        the session has no broadcast)."""
        if self._broadcast is None:
            return None
        if self._broadcast.end():
            log.info("broadcast ended by the session's owner (the session goes on)")
        url = self._broadcast.url
        ended: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        written = asyncio.wrap_future(self._broadcast.written())

        def settle(_: object) -> None:
            if not ended.done():
                ended.set_result(url)

        written.add_done_callback(settle)
        return ended

    @property
    def branching(self) -> bool:
        """Whether the start is a branch of a recording (`from_recording`)."""
        return self._branch is not None

    async def branch_start(self, given: dict[str, Any]) -> bytes:
        """The model's start for the branch (rtvideo.proxy.recordings.branch); ProtocolError when
        the recording cannot be branched so."""
        assert self._branch is not None and self._features is not None
        start, self._branch = await branch_start(self._features.recordings, self._branch, given)
        return start

    def heard(self, message: Mapping[str, Any], guest: Guest | None) -> None:
        """A message a participant sent (None: the owner), parsed: into the recording."""
        if self._recorder is not None:
            self._recorder.received(message, guest)

    def told(self, message: Mapping[str, Any], guest: Guest) -> None:
        """A message written to a guest steerer alone: into the recording."""
        if self._recorder is not None:
            self._recorder.told(message, guest)

    def offer(
        self, session: Joinable, handouts: Handouts, message: dict[str, Any], text: str
    ) -> tuple[dict[str, Any], str]:
        """video.start with what the start asked for: a resume token and the grace, a watch token.
        Unchanged (the model's own text) for a start that asked for neither."""
        features = self._features
        if features is None or (not any(self._options.values()) and self._recorder is None and not self._branch):
            return message, text
        out = dict(message)
        config = dict(out.get("config") or {})
        if self._options.get("resumable"):
            config["resume_grace_seconds"] = features.resume_grace
            if features.resume_grace > 0:
                self._replay = ReplayBuffer(self._settings.replay_buffer_bytes)
                handouts.tap(self._replay.record)
                self._resume_token = features.resume_tokens.issue(session)
        if self._options.get("watchable") and self._settings.max_watchers_per_session > 0:
            self._hub = WatchHub(self._settings, features.watchers, self._metrics)
            handouts.tap(self._hub.publish)
            self._watch_token = features.watch_tokens.issue(session)
        if self._options.get("steerable") and self._settings.max_steerers_per_session > 0:
            self._steer_hub = SteerHub(self._settings, features.steerers, self._metrics)
            handouts.tap(self._steer_hub.publish)
            self._steer_token = features.steer_tokens.issue(session)
        out["config"] = config
        if self._branch is not None:  # only the built-in generator's rebuild is exact (branch.py)
            out["branched_from"] = self._branch.as_json()
            out["branch_exact"] = self._branch.exact
        handouts.keep_start(out)
        if self._recorder is not None:  # the owner's alone, as the tokens are
            out["recording_id"] = self._recorder.rid
        if self._broadcast is not None:  # the owner's to share: whoever has it may watch
            out["broadcast_url"] = self._broadcast.url
        if self._resume_token is not None:
            out["resume_token"] = self._resume_token
        out.update(self._marks())
        return out, server_messages.encode(out)

    @property
    def options(self) -> dict[str, bool]:
        """What the start asked of the proxy (resumable, watchable, steerable, record)."""
        return dict(self._options)

    def restore(self, session: Joinable, handouts: Handouts, saved: SavedSession, resumed: str) -> None:
        """A session taken over from another replica (rtvideo.proxy.continuity.takeover), as
        stored (`saved`): what its start asked for, set up as `offer` did there; `resumed`, the
        resume token its owner came back with; its watch and steer tokens open it here by their
        hashes; its recording goes on (`_go_on_recording`). Its replay buffer is filled next
        (`replayable`)."""
        features = self._features
        assert features is not None
        options, hashes = saved.options, saved.token_hashes
        self._options = dict(options)
        if options.get("resumable") and features.resume_grace > 0:
            self._replay = ReplayBuffer(self._settings.replay_buffer_bytes)
            self._resume_token = resumed
            features.resume_tokens.adopt(token_hash(resumed), session)
        if options.get("watchable") and self._settings.max_watchers_per_session > 0:
            self._hub = WatchHub(self._settings, features.watchers, self._metrics)
            handouts.tap(self._hub.publish)
            if "watch" in hashes:
                features.watch_tokens.adopt(self._adopted.setdefault("watch", hashes["watch"]), session)
        if options.get("steerable") and self._settings.max_steerers_per_session > 0:
            self._steer_hub = SteerHub(self._settings, features.steerers, self._metrics)
            handouts.tap(self._steer_hub.publish)
            if "steer" in hashes:
                features.steer_tokens.adopt(self._adopted.setdefault("steer", hashes["steer"]), session)
        if saved.recording_id:
            self._go_on_recording(saved, handouts)
        if saved.broadcast_id:
            self._go_on_broadcast(saved, handouts)

    def _go_on_broadcast(self, saved: SavedSession, handouts: Handouts) -> None:
        """The broadcast of a session taken over goes on here: same id and URL, its playlist's
        media sequence going on, the chunks the session store kept that it lacks written first
        (rtvideo.proxy.broadcasts.writer `resume`). With broadcasts off here it is not continued,
        and the proxy says so; its playlist stays as it was (no ENDLIST) until it is swept."""
        assert self._features is not None and saved.broadcast_id is not None
        broadcasts = self._features.broadcasts
        if broadcasts is None:
            log.error(
                "request_id=%s broadcast not continued: broadcasts are off on this proxy (--broadcast-store)",
                saved.request_id,
            )
            return
        config = saved.handed_start.get("config")
        fps = config.get("fps") if isinstance(config, dict) else None
        earlier = [
            (e.index, int(e.message.get("num_frames") or 0), e.data)
            for e in saved.log
            if isinstance(e, SavedFrame) and e.index is not None and e.data and e.message.get("kind") == MEDIA
        ]
        try:
            self._broadcast = broadcasts.resume(
                saved.broadcast_id, saved.init, earlier, float(fps) if isinstance(fps, (int, float)) else None
            )
        except MalformedId:
            log.error("request_id=%s: the stored broadcast id is malformed; not continued", saved.request_id)
            return
        handouts.record_to(self._broadcast)

    def _go_on_recording(self, saved: SavedSession, handouts: Handouts) -> None:
        """The recording of a session taken over goes on here under its id, following what is
        handed out from now on (attached before anything is; the saved log is written from the
        store, not through the handouts, so nothing is written twice). Its token, known here by
        its hash, still opens it, and stays in the store for a later takeover. With recordings
        off here the session goes on unrecorded, and the proxy says so (never the client)."""
        assert self._features is not None and saved.recording_id is not None
        rid, digest = saved.recording_id, saved.token_hashes.get("recording")
        if digest is not None:
            self._adopted["recording"] = digest
        recordings = self._features.recordings
        if recordings is None:
            log.error(
                "request_id=%s recording_id=%s not continued: recordings are off on this proxy (--recordings); "
                "the session goes on unrecorded",
                saved.request_id,
                rid,
            )
            return
        try:
            self._recorder = recordings.reopen(
                rid, saved.log, digest, holder_gone=saved.age >= self._settings.lease_seconds
            )
        except MalformedId:
            log.error(
                "request_id=%s: the stored recording id is malformed; the session goes on unrecorded", saved.request_id
            )
            self._metrics.recording_failures.labels("not continued").inc()
            return
        handouts.record_to(self._recorder)

    def replayable(self, cut: int, frames: list[Frame], handouts: Handouts) -> None:
        """A takeover's replay buffer: `frames`, handed out after the pair `cut` by the replica it
        was taken over from; then it follows what is handed out here."""
        if self._replay is not None:
            self._replay.resumes_after(cut)
            for frame in frames:
                self._replay.record(frame)
            handouts.tap(self._replay.record)

    def _marks(self) -> dict[str, str]:
        """The watch, steer and recording tokens of the session, as video.start carries them."""
        marks = {}
        if self._recording_token is not None:
            marks["recording_token"] = self._recording_token
        if self._watch_token is not None:
            marks["watch_token"] = self._watch_token
        if self._steer_token is not None:
            marks["steer_token"] = self._steer_token
        return marks

    def token_hashes(self) -> dict[str, str]:
        """The live tokens of the session, hashed, by kind (rtvideo.proxy.continuity.record)."""
        live = {"resume": self._resume_token, **{k.removesuffix("_token"): v for k, v in self._marks().items()}}
        return {**self._adopted, **{kind: token_hash(token) for kind, token in live.items() if token is not None}}

    @property
    def recording_id(self) -> str | None:
        return None if self._recorder is None else self._recorder.rid

    def revoke_steering(self) -> int:
        """The owner revoked steering: the steer token is retired, every steerer closed. Returns
        how many were."""
        if self._features is not None:
            self._features.steer_tokens.retire(self._steer_token, "steering was revoked by the session's owner")
            self._features.steer_tokens.retire_hash(self._adopted.pop("steer", None), "steering was revoked")
        self._steer_token = None
        return self._steer_hub.revoke() if self._steer_hub is not None else 0

    # --- a detached session and its resume ------------------------------------------------------
    def hold_open(self, on_over: Callable[[], None]) -> float:
        """The owner dropped: the resume token stays good for the grace; `on_over` when it is over.
        Returns the grace."""
        assert self._features is not None
        grace = self._features.resume_grace
        self._grace_timer = asyncio.get_running_loop().call_later(grace, self._grace_over, on_over)
        self._metrics.sessions_detached.inc()
        self._detached_counted = True
        return grace

    def _grace_over(self, on_over: Callable[[], None]) -> None:
        self._grace_timer = None
        on_over()

    def expire(self) -> None:
        """The grace is over: the resume token stops working, and says why."""
        assert self._features is not None
        why = f"expired: the session was not resumed within {self._features.resume_grace:g} s"
        self._features.resume_tokens.retire(self._resume_token, why)

    def replay_after(self, last: int) -> list[Frame]:
        """What a resume from the pair `last` is given again; ResumeRefused when it cannot be."""
        if self._replay is None or self._features is None:
            raise ResumeRefused("the session has ended")
        try:
            return self._replay.after(last)
        except ReplayGap as exc:
            raise ResumeRefused(str(exc), exc.oldest) from None

    def taken_up(self, session: Resumable, used: str) -> dict[str, str]:
        """A resume attached a new owner with the token `used`: the grace stops, and the tokens
        its video.start carries (a fresh resume token: each is used once)."""
        assert self._features is not None
        self._cancel_grace()
        tokens = self._features.resume_tokens
        tokens.retire(used, "this token was used already: each resume hands out a new one")
        self._resume_token = tokens.issue(session)
        marks = {"resume_token": self._resume_token, **self._marks()}
        if self._broadcast is not None:  # the owner's again, as at the start
            marks["broadcast_url"] = self._broadcast.url
        return marks

    def uncount(self) -> None:
        """No longer detached: out of the gauge."""
        if self._detached_counted:
            self._metrics.sessions_detached.dec()
            self._detached_counted = False

    def _cancel_grace(self) -> None:
        if self._grace_timer is not None:
            self._grace_timer.cancel()
            self._grace_timer = None

    def close(self, handed_off: bool = False) -> None:
        """The session is over here: its tokens stop working, its watchers go (with 1012 when it
        was `handed_off` to another replica, where they rejoin), its gauges drop. The guests'
        tokens of a session `handed_off` are let go, not ended: the guests closed here rejoin at
        once, maybe here, while this replica may still hold the lease (its writes are finished
        and the lease released after the owner's link closed): told "moving" then, not ended."""
        self._cancel_grace()
        self.uncount()
        if (features := self._features) is not None:
            features.resume_tokens.retire(self._resume_token, "the session has ended")
            for book, token, kind in (
                (features.watch_tokens, self._watch_token, "watch"),
                (features.steer_tokens, self._steer_token, "steer"),
            ):
                if handed_off:  # not ended: a guest back here is told where it went (503 until released)
                    book.let_go(token)
                    book.let_go_hash(self._adopted.get(kind))
                else:
                    book.retire(token, "the session has ended")
                    book.retire_hash(self._adopted.get(kind), "the session has ended")
        if handed_off and self._broadcast is not None:
            self._broadcast.let_go()  # the next holder goes on with its playlist: no ENDLIST here
        code = 1012 if handed_off else 1000
        if self._hub is not None:
            self._hub.close(code)
        if self._steer_hub is not None:
            self._steer_hub.close(code)
