"""A session's Triton side: one stream at a time (rtvideo.proxy.placement.streams) and what is in
flight on it (docs/protocol.md §7–8).

It counts the requests whose one answer is due (the in-flight bound is the session's),
keeps the sequence from Triton's idle timeout with keep-alives of its own, forwards at most
one client ping a second to reset the model's stall clock, pauses the generator of a
detached session, and takes a stream that fell silent or broke for broken. The answers to
its own requests (keep-alives, pauses, forwarded pings) are dropped here: the session sees
only what is for a client.

A move to another Triton is `take_over`: the new stream carries the session from then on,
what goes up is put in its coordinates (`report`), and nothing above this class changes. A
new stream numbers its requests' tags from 1 again; each stream after the first has its tags
(but the start's) marked with its epoch here, both ways, so a tag names one request for the
whole session and a late answer can never be taken for another's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from rtvideo.core import protocol, server_messages
from rtvideo.proxy.phase import Phase, SessionPhase
from rtvideo.proxy.placement.bridge import KEEPALIVE, PING, STOP, BackendUnavailable
from rtvideo.proxy.placement.streams import SessionStream
from rtvideo.proxy.settings import ProxySettings
from rtvideo.proxy.tasks import TaskSet
from rtvideo.triton.access import short_hash
from rtvideo.triton.wire import START_TAG, Reply

log = logging.getLogger(__name__)

#: the proxy's own pings that pause and resume a detached session's generator (docs/triton-model.md)
PAUSE = server_messages.encode({"type": protocol.PING, "keepalive": True, "pause": True}).encode()
UNPAUSE = server_messages.encode({"type": protocol.PING, "keepalive": True, "pause": False}).encode()


@dataclass(frozen=True)
class UpstreamTimes:
    """The timings of a session's Triton side, in seconds."""

    keepalive: float  # a sequence that had nothing forwarded this long gets a keep-alive
    ping_forward: float  # at most one client ping goes on to Triton this often
    end_grace: float  # how long Triton may take to end the call after sequence_end


class Upstream:
    """One session's stream to Triton and the requests in flight on it."""

    def __init__(
        self,
        life: SessionPhase,
        settings: ProxySettings,
        times: UpstreamTimes,
        tasks: TaskSet,
        on_reply: Callable[[Reply], None],
        on_broken: Callable[[str], None],
        on_sent: Callable[[bytes], None] = lambda raw: None,
    ) -> None:
        self._life = life
        self._settings = settings
        self._times = times
        self._tasks = tasks
        self.on_reply = on_reply  # every reply the pump reads, in arrival order
        self._on_broken = on_broken  # the current stream broke while the session is live
        self._on_sent = on_sent  # every later request, as it goes to Triton (a move's log)
        self._report: Callable[[bytes], bytes] = lambda raw: raw  # a report, into the stream's media time
        self._epoch = 0  # streams taken over so far (the current stream's tag mark)
        self._stream: SessionStream | None = None  # while there is a sequence to end
        self._over = asyncio.Event()  # the current stream's call ended (or broke, or was cancelled)
        self._stop_tag: str | None = None  # the request that carried sequence_end
        self._in_flight: set[str] = set()  # tags of requests whose one answer is due
        self._ping_tag: str | None = None  # the forwarded session.ping in flight (its pong is dropped)
        self._ping_forwarded = float("-inf")  # when the last one went
        self._keepalive_tags: set[str] = set()  # keep-alives and pauses sent (their pongs are dropped)
        self._forwarded = time.monotonic()  # when a request last went to Triton on the sequence
        self._heard = time.monotonic()  # when Triton last sent anything on the stream
        self._keepalive_timer: asyncio.TimerHandle | None = None
        self._silence_timer: asyncio.TimerHandle | None = None

    @property
    def stream(self) -> SessionStream | None:
        return self._stream

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    def awaiting(self, tag: str) -> bool:
        """Whether request `tag` is still in flight on the current stream (its answer is due)."""
        return tag in self._in_flight

    def answers_stop(self, tag: str) -> bool:
        """Whether `tag` is the request that carried sequence_end (its answer is the trailer and done)."""
        return tag == self._stop_tag

    # --- the stream -----------------------------------------------------------------------------
    def open(self, stream: SessionStream) -> None:
        """The session's first stream, its session.start sent: read it, and watch it."""
        self._attach(stream)
        self._watch_silence()
        self._keep_alive()

    def take_over(self, stream: SessionStream, report: Callable[[bytes], bytes]) -> None:
        """A move to another Triton: `stream` carries the session from now on (the caller starts
        its sequence there); `report` puts a playhead report in its media time. The old stream,
        if it still runs (a drain), is cancelled with whatever was in flight on it: those answers
        never come, so they count against no bound and are awaited by nobody."""
        old, self._stream = self._stream, None
        if old is not None:
            old.cancel()
        self._in_flight.clear()
        self._keepalive_tags.clear()
        self._ping_tag = None
        self._report = report
        self._epoch += 1
        self.stop_timers()
        self._attach(stream)
        self._watch_silence()
        self._keep_alive()

    def _attach(self, stream: SessionStream) -> None:
        self._stream = stream
        self._heard = self._forwarded = time.monotonic()
        self._over = asyncio.Event()
        self._tasks.spawn(self._pump(stream, self._over, self._epoch))

    def _tag(self, tag: str, epoch: int | None = None) -> str:
        """A stream's tag as the session knows it (module docstring)."""
        epoch = self._epoch if epoch is None else epoch
        return tag if epoch == 0 or tag == START_TAG else f"{tag}~{epoch}"

    def _send(self, stream: SessionStream, raw: bytes, *, end: bool = False) -> str:
        return self._tag(stream.send(raw, end=end))

    async def _pump(self, stream: SessionStream, over: asyncio.Event, epoch: int) -> None:
        try:
            async for reply in stream.replies():
                if self._stream is not stream:
                    break  # taken over: what the old stream still says is nobody's
                if epoch:
                    reply = dataclasses.replace(reply, tag=self._tag(reply.tag, epoch))
                self.on_reply(reply)
            if self._life.live and self._stream is stream and not self._life.done_while_detached:
                raise BackendUnavailable("Triton ended the stream before session.done")
        except BackendUnavailable as exc:
            self._broke(stream, str(exc))
        finally:
            over.set()

    def _broke(self, stream: SessionStream, reason: str) -> None:
        """The stream failed (or fell silent): nothing is left to end on Triton's side."""
        stream.cancel()
        if self._stream is not stream:
            return  # replaced or ended already: the session no longer depends on it
        self._stream = None
        if self._life.live:
            self._on_broken(reason)

    def received(self, reply: Reply) -> bool:
        """A reply from Triton: whether it is for a client (not flags-only, not the answer to a
        request of the proxy's own)."""
        self._heard = time.monotonic()
        self._in_flight.discard(reply.tag)
        if reply.message is None:
            return False  # flags-only: nothing for the client (the streams yield none)
        if reply.tag == self._ping_tag:
            self._ping_tag = None
            return False  # the client had its pong from the proxy
        if reply.tag in self._keepalive_tags:
            self._keepalive_tags.discard(reply.tag)
            return False  # the proxy's own keep-alive or pause
        return True

    # --- requests -------------------------------------------------------------------------------
    def send(self, raw: bytes) -> str:
        """One later request; it counts as in flight until its one answer arrives."""
        assert self._stream is not None  # STREAMING
        tag = self._send(self._stream, raw)
        self._in_flight.add(tag)
        self._forwarded = time.monotonic()
        self._on_sent(raw)
        return tag

    def send_report(self, raw: bytes) -> None:
        """A request the model completes flags-only and answers nothing (a playhead report):
        never in flight; sent while the sequence is open to the client's messages."""
        if self._life.phase is Phase.STREAMING and self._stream is not None:
            self._stream.send(self._report(raw))
            self._forwarded = time.monotonic()

    def send_stop(self) -> None:
        """session.stop goes with sequence_end (flags-only, so never counted in flight); the
        session sends it once, as it moves STREAMING → STOP_SENT."""
        assert self._stream is not None and self._life.phase is Phase.STREAMING
        self._stop_tag = self._send(self._stream, STOP, end=True)

    def forward_ping(self) -> None:
        """Pings are answered by the session; one a second at most, and one at a time, goes to
        Triton to reset the model's stall clock (docs/protocol.md §7). Its pong is dropped."""
        now = time.monotonic()
        if (
            self._life.phase is Phase.STREAMING
            and self._ping_tag is None
            and now - self._ping_forwarded >= self._times.ping_forward
            and len(self._in_flight) < self._settings.max_requests_in_flight
        ):
            self._ping_tag, self._ping_forwarded = self.send(PING), now

    def pause(self, paused: bool) -> None:
        """Pause (or go on with) the model's generator: a keep-alive of the proxy's own."""
        if self._stream is not None:
            self._keepalive_tags.add(self._send(self._stream, PAUSE if paused else UNPAUSE))
            self._forwarded = time.monotonic()

    # --- timers ---------------------------------------------------------------------------------
    def _keep_alive(self) -> None:
        """One timer while the sequence is open: when nothing went to Triton on it for the
        keep-alive time, a keep-alive does (docs/protocol.md §8). It is no client message: no
        rate or in-flight bound counts it, its pong is dropped, and the model does not take it
        for progress (the stall clock, §7)."""
        self._keepalive_timer = None
        stream = self._stream
        if stream is None or self._life.phase not in (Phase.STREAMING, Phase.DETACHED):
            return
        quiet = time.monotonic() - self._forwarded
        if quiet >= self._times.keepalive:
            self._keepalive_tags.add(self._send(stream, KEEPALIVE))
            self._forwarded, quiet = time.monotonic(), 0.0
        delay = self._times.keepalive - quiet
        self._keepalive_timer = asyncio.get_running_loop().call_later(delay, self._keep_alive)

    def _watch_silence(self) -> None:
        """One timer while the stream is live; when it fires early (Triton spoke since it was
        armed) it re-arms for the rest, so a reply costs only a clock read."""
        self._silence_timer = None
        stream = self._stream
        if stream is None or not self._life.live:
            return
        limit = self._settings.backend_silence_seconds
        quiet = time.monotonic() - self._heard
        if quiet < limit:
            self._silence_timer = asyncio.get_running_loop().call_later(limit - quiet, self._watch_silence)
        else:
            self._broke(stream, f"Triton sent nothing for {limit:g} s")

    def stop_timers(self) -> None:
        for timer in (self._silence_timer, self._keepalive_timer):
            if timer is not None:
                timer.cancel()

    # --- the end --------------------------------------------------------------------------------
    async def end(self) -> None:
        """End the sequence and the call: `sequence_end` (unless the client's stop carried it),
        then half-close the request stream; Triton ends the call once every request has
        completed. The stop's own answer is flags-only and never reaches an aio client, so the
        end of the call is what is awaited (bounded), then the stream is dropped."""
        stream = self._stream
        if stream is None:
            return  # never opened, or broken
        self._stream = None
        if self._stop_tag is None:
            self._stop_tag = self._send(stream, STOP, end=True)
        stream.close_requests()
        try:
            await asyncio.wait_for(self._over.wait(), self._times.end_grace)
        except asyncio.TimeoutError:
            log.warning(
                "request_id=%s sequence=%s Triton did not end the call within %g s; cancelling",
                self._life.request_id,
                short_hash(stream.sequence_id),
                self._times.end_grace,
            )
        stream.cancel()
