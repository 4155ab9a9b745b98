"""One session's stream placed over the Triton endpoints of an `EndpointPool`
(rtvideo.proxy.placement.pool): the attempts, the replay and the refusals.

`PlacedStream` is one session's `SessionStream` (rtvideo.proxy.placement.streams), in one `Placement`
state. It starts on the first of its candidate endpoints (the pool's choice). Until the model
answers session.start, what the client sent is kept: when the endpoint answers `server_busy`
(another proxy or client filled it) or fails, the sequence there is ended and everything is
replayed on the next endpoint, on a new stream with a new sequence id. Nothing of a refused
attempt reaches the client; when every candidate refuses, the last refusal is the answer.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import AsyncGenerator, AsyncIterator, Coroutine
from typing import Any, Protocol

from rtvideo.core import protocol
from rtvideo.core.errors import ErrorCode
from rtvideo.proxy.placement.bridge import END_GRACE_SECONDS, STOP, BackendUnavailable, TritonStream
from rtvideo.proxy.placement.endpoint import Endpoint
from rtvideo.triton.wire import START_TAG, Reply

#: how often a patient stream asks the pool again for an endpoint
PATIENCE_POLL_SECONDS = 0.25


def _is_busy(reply: Reply) -> bool:
    message = reply.message or {}
    return message.get("type") == protocol.ERROR and message.get("code") == ErrorCode.SERVER_BUSY.value


class StreamPool(Protocol):
    """The pool as a placed stream sees it (`EndpointPool`, rtvideo.proxy.placement.pool): where it
    takes and leaves a slot, and what it is told of each attempt's answer."""

    def attach(self, endpoint: Endpoint, stream: PlacedStream) -> None: ...

    def detach(self, endpoint: Endpoint, stream: PlacedStream) -> None: ...

    def start_answered(self, endpoint: Endpoint, busy: bool) -> None: ...

    def start_refused(self, endpoint: Endpoint, final: bool = False) -> None: ...

    def start_failed(self, endpoint: Endpoint, reason: str) -> None: ...

    def stream_failed(self, endpoint: Endpoint, reason: str) -> None: ...

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None: ...

    def candidates(self) -> list[Endpoint]: ...


# --- one session's stream ------------------------------------------------------------------------
class Placement(enum.Enum):
    """Where a placed stream is. Moves forward only: PLACING (one attempt after another) until
    its model answers session.start (PLACED) or no endpoint is left (EXHAUSTED); from any state,
    CANCELLED once the session ended it."""

    PLACING = enum.auto()  # an attempt is open on one endpoint; what the session sent is kept for the next
    PLACED = enum.auto()  # its model answered session.start: bound to that endpoint for good
    EXHAUSTED = enum.auto()  # no candidate left: `replies` raises BackendUnavailable (a patient one waits first)
    CANCELLED = enum.auto()  # the session ended it


class PlacedStream:
    """One session's stream over the pool, a `SessionStream`; bound to one endpoint for good once
    its model answers session.start."""

    def __init__(self, pool: StreamPool, candidates: list[Endpoint], patience: float = 0.0) -> None:
        """`patience`: seconds it waits for an endpoint to take it when none can now (a session
        moving off a lost Triton waits for one to come back); 0: it gives up at once."""
        self._pool = pool
        self._patient_until = time.monotonic() + patience
        self._candidates = list(candidates)  # not tried yet, best first
        self._sent: list[tuple[bytes, bool, bool]] = []  # replayed on the next attempt until placed
        self._count = 0
        self.state = Placement.PLACING
        self.admitted = False  # its model answered its session.start with video.start: it has a slot
        self.attempts = 0
        self.endpoint: Endpoint | None = None
        self._stream: TritonStream | None = None
        self._lost: str | None = None  # the endpoint went down under this attempt
        self._why = "no Triton endpoint takes new sessions now"
        self._next_attempt()

    @property
    def replayable(self) -> int:
        """Requests kept to be sent again on the next endpoint (none once placed)."""
        return len(self._sent)

    @property
    def placed(self) -> bool:
        return self.state is Placement.PLACED

    @property
    def sequence_id(self) -> int:
        return self._stream.sequence_id if self._stream is not None else 0

    def close_requests(self) -> None:
        """Half-close the current attempt's requests (`TritonStream.close_requests`)."""
        if self._stream is not None:
            self._stream.close_requests()

    # --- the session's side -----------------------------------------------------------------
    def send(self, raw: bytes, *, start: bool = False, end: bool = False) -> str:
        """Queue one client message; returns the tag its replies carry (the same on every attempt)."""
        self._count += 1
        if self.state in (Placement.PLACING, Placement.EXHAUSTED):  # a patient one may yet be placed
            self._sent.append((raw, start, end))
        if self._stream is not None:
            return self._stream.send(raw, start=start, end=end)
        return START_TAG if start else f"m{self._count}"

    async def replies(self) -> AsyncIterator[Reply]:
        """The placed attempt's replies; raises BackendUnavailable when no endpoint can take the
        session or its endpoint fails."""
        while True:
            stream, endpoint = self._stream, self.endpoint
            if stream is None or endpoint is None:
                if not await self._wait_for_endpoint():
                    raise BackendUnavailable(self._why)
                continue
            held: list[Reply] = []  # answers to later requests, before the start's first answer
            iterator = stream.replies()
            failure: str | None = None
            refused = False
            try:
                while self._lost is None:
                    try:
                        reply = await iterator.__anext__()
                    except StopAsyncIteration:
                        break
                    if self.state is not Placement.PLACING:
                        yield reply
                    elif reply.tag != START_TAG:
                        held.append(reply)
                    elif _is_busy(reply) and any(e.admitting for e in self._candidates):
                        refused = True
                        break
                    else:  # video.start, or an answer that is the session's (the last busy one too)
                        self.state = Placement.PLACED
                        self._sent.clear()
                        declined = bool(reply.message and reply.message.get("type") == protocol.ERROR)
                        self.admitted = not declined
                        self._pool.start_answered(endpoint, _is_busy(reply))
                        if declined:
                            self._leave()  # refused for good: it takes no slot there (its sequence still ends)
                        for early in held:
                            yield early
                        held.clear()
                        yield reply
            except BackendUnavailable as exc:
                if self.state is Placement.PLACED and self._lost is None:
                    self._pool.stream_failed(endpoint, str(exc))
                if self.state is not Placement.PLACING:
                    raise
                failure = str(exc)
            if self.state is Placement.CANCELLED:
                return
            if self.state is Placement.PLACED:
                if self._lost is not None:
                    raise BackendUnavailable(f"triton endpoint {endpoint.address} is down: {self._lost}")
                return  # the stream ended; the session knows whether that was early
            # Not placed: refused, failed, down, or ended without an answer: the next endpoint.
            if refused:
                self._pool.start_refused(endpoint)
                stream.send(STOP, end=True)
                stream.close_requests()
                self._pool.spawn(_end_refused(stream, iterator))
            else:
                reason = failure or (
                    f"the endpoint went down: {self._lost}"
                    if self._lost
                    else "the stream ended before session.start was answered"
                )
                self._why = f"no Triton endpoint could start the session; last: {reason}"
                self._pool.start_failed(endpoint, reason)
                stream.cancel()
                await iterator.aclose()
            self._leave()
            if not self._next_attempt() and time.monotonic() >= self._patient_until:
                raise BackendUnavailable(self._why)

    def cancel(self) -> None:
        """End the stream now (the session is over); frees its place on the endpoint."""
        self.state = Placement.CANCELLED
        if self._stream is not None:
            self._stream.cancel()
        self._leave()

    # --- the pool's side ---------------------------------------------------------------------
    def lost(self, reason: str) -> None:
        """The endpoint is down: a placed session's stream breaks (the session moves or ends); one
        not yet placed tries the next endpoint."""
        if self._lost is None and self._stream is not None and self.state is not Placement.CANCELLED:
            self._lost = reason
            self._stream.cancel()

    async def _wait_for_endpoint(self) -> bool:
        """Within its patience, wait until the pool offers an endpoint and an attempt begins there."""
        while self.state is Placement.EXHAUSTED and time.monotonic() < self._patient_until:
            await asyncio.sleep(PATIENCE_POLL_SECONDS)
            if self.state is not Placement.EXHAUSTED:
                break  # cancelled meanwhile
            self.state = Placement.PLACING
            self._candidates = self._pool.candidates()
            if self._next_attempt():
                return True
        return False

    def _next_attempt(self) -> bool:
        while self._candidates:
            endpoint = self._candidates.pop(0)
            if not endpoint.admitting:
                continue
            self.endpoint, self._lost = endpoint, None
            self._pool.attach(endpoint, self)
            self._stream = endpoint.bridge.open_stream()
            self.attempts += 1
            for raw, start, end in self._sent:  # the same requests in the same order: the same tags
                self._stream.send(raw, start=start, end=end)
            return True
        self._stream = None
        self.state = Placement.EXHAUSTED
        return False

    def _leave(self) -> None:
        endpoint, self.endpoint = self.endpoint, None
        if endpoint is not None:
            self._pool.detach(endpoint, self)


async def _end_refused(stream: TritonStream, iterator: AsyncGenerator[Reply, None]) -> None:
    """Let a refused attempt's sequence end on its server (or it would hold a sequence-batcher
    slot until the idle timeout): its stop went out and its requests are half-closed, so Triton
    ends the call once the stop was delivered; then drop the stream."""

    async def drained() -> None:
        async for _ in iterator:
            pass

    try:
        await asyncio.wait_for(drained(), END_GRACE_SECONDS)
    except (BackendUnavailable, asyncio.TimeoutError):
        pass
    finally:
        stream.cancel()
