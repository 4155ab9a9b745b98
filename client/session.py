"""A small async client for `WebSocket /v1/realtime/video` (docs/protocol.md), on `websockets`.

async with RealtimeVideoClient("ws://127.0.0.1:8080/v1/realtime/video") as c:
    start = await c.start("A quiet harbour at dawn", num_frames=144)
    ack = await c.interact("A snowy street", transition_chunks=3)
    async for chunk in c.chunks():
        ...  # chunk.metadata, chunk.data
"""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from rtvideo.client.errors import RealtimeVideoError
from rtvideo.client.reconnect import Reconnect
from rtvideo.core import protocol
from rtvideo.core.errors import SESSION_ENDING_CODES, ErrorCode

_ENDING = {code.value for code in SESSION_ENDING_CODES}
_INTERACTION_REJECTED = {ErrorCode.INVALID_INTERACTION.value, ErrorCode.EVENT_ID_CONFLICT.value}
#: an interaction refused `store_unavailable` (a shared session store could not keep it now;
#: never applied) is sent again with the same event id, waiting this long first, then twice as
#: long each time up to `STORE_BACKOFF_MAX`, for at most the client's `store_retry_seconds`
STORE_BACKOFF_SECONDS = 0.2
STORE_BACKOFF_MAX = 2.0


#: the leading bytes of the image formats an `image_reference` may hold, and their media types
_IMAGE_TYPES = {b"\x89PNG\r\n\x1a\n": "image/png", b"\xff\xd8\xff": "image/jpeg", b"RIFF": "image/webp"}


def image_data_url(path: str | Path) -> str:
    """A PNG, JPEG or WebP file as the `data:` URL a start's `image_reference` takes
    (`{"image_url": image_data_url(path)}`); ValueError for another kind of file."""
    data = Path(path).read_bytes()
    kind = next((media for magic, media in _IMAGE_TYPES.items() if data.startswith(magic)), None)
    if kind is None or (kind == "image/webp" and data[8:12] != b"WEBP"):
        raise ValueError(f"{path}: not a PNG, JPEG or WebP image")
    return f"data:{kind};base64,{base64.b64encode(data).decode('ascii')}"


def blend_prompts(prompts: Sequence[tuple[str, float] | Mapping[str, Any]]) -> list[dict[str, Any]]:
    """`(text, weight)` pairs (or `{text, weight}` objects) as `prompts` sends them."""
    return [dict(p) if isinstance(p, Mapping) else {"text": p[0], "weight": p[1]} for p in prompts]


def camera_payload(
    mode: str, translation: tuple[float, float, float], rotation: tuple[float, float, float, float] = (0, 0, 0, 1)
) -> dict[str, Any]:
    """A camera event's payload (Unity axes: +X right, +Y up, +Z forward; rotation x, y, z, w)."""
    return {"mode": mode, "data": {"translation": list(translation), "rotation": list(rotation)}}


@dataclass(frozen=True)
class Chunk:
    """One `video.chunk_metadata` and the binary payload that followed it."""

    metadata: dict[str, Any]
    data: bytes


_END = object()  # end-of-stream marker in the chunk queue


class VirtualPlayhead:
    """The media time a player of the received stream would show now, for `session.playback`
    reports (docs/protocol.md §2.6) from a client that does not play: playback begins when the
    first media chunk arrives, runs at real time, and waits at the end of what arrived (a
    stall), as a browser's would. Pure: times are passed in."""

    def __init__(self) -> None:
        self._received = 0.0  # media seconds arrived
        self._position = 0.0
        self._at: float | None = None  # when `_position` was last advanced (None: not playing yet)

    def received(self, seconds: float, now: float) -> None:
        self._advance(now)
        self._received += seconds
        if self._at is None:
            self._at = now

    def position(self, now: float) -> float:
        self._advance(now)
        return self._position

    def buffered(self, now: float) -> float:
        return self._received - self.position(now)

    def report(self, now: float) -> dict[str, Any]:
        """The `session.playback` message for `now`."""
        position = self.position(now)
        return {
            "type": protocol.PLAYBACK,
            "position_seconds": round(position, 4),
            "buffered_seconds": round(self._received - position, 4),
        }

    def _advance(self, now: float) -> None:
        if self._at is not None:
            self._position = min(self._received, self._position + max(0.0, now - self._at))
            self._at = now

    @staticmethod
    def chunk_seconds(metadata: dict[str, Any], video_start: dict[str, Any] | None) -> float:
        """Media seconds of one chunk (0 for the trailer or without a known fps)."""
        fps = ((video_start or {}).get("config") or {}).get("fps")
        frames = metadata.get("num_frames")
        if metadata.get("kind") != "media" or not isinstance(fps, (int, float)) or fps <= 0:
            return 0.0
        return frames / fps if isinstance(frames, int) else 0.0


@dataclass
class _AckWait:
    """The future every `interact()` for one event id waits on, and how many do."""

    future: asyncio.Future[dict[str, Any]]
    waiters: int = 0
    #: resolved by a `store_unavailable` naming the event: every waiter sends it again (a new
    #: one is made for each round of sends)
    refused: asyncio.Future[None] | None = None


class RealtimeVideoClient:
    """One session. Errors that do not end the session go to `on_error` (default: the
    `errors` queue); a session-ending error is raised by `chunks()` (and `start()`)."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        on_error: Callable[[RealtimeVideoError], None] | None = None,
        open_timeout: float = 10.0,
        report_playback: float | None = None,
        resume_attempts: int = 5,
        resume_backoff: float = 0.25,
        store_retry_seconds: float = 10.0,
    ) -> None:
        """`report_playback`: send a `session.playback` report this often (seconds) from the
        media time a player started on the first chunk would show (`VirtualPlayhead`), so the
        server paces the stream to it; None (the default): no reports, the fixed lead.
        `store_retry_seconds`: how long `interact` keeps sending an interaction again that the
        session store could not keep (`store_unavailable`) before it raises that error."""
        self._store_retry_seconds = store_retry_seconds
        self.url = url
        self.playhead = VirtualPlayhead()
        self._report_every = report_playback
        self._reporter: asyncio.Task | None = None
        self._token = token
        self._open_timeout = open_timeout
        self.errors: asyncio.Queue[RealtimeVideoError] = asyncio.Queue()
        self._on_error = on_error or self.errors.put_nowait
        self._ws: ClientConnection | None = None
        self._reader: asyncio.Task | None = None
        self._started: asyncio.Future[dict[str, Any]] | None = None
        self._acks: dict[str, _AckWait] = {}
        self._chunks: asyncio.Queue[Any] = asyncio.Queue()
        self.video_start: dict[str, Any] | None = None
        self.done: dict[str, Any] | None = None
        self.steering_revoked: dict[str, Any] | None = None  # the answer to revoke_steering()
        #: `session.interaction.shared`: the other participants' updates, in the order told
        #: (docs/protocol.md §9.4; sent only in steerable or watchable sessions)
        self.shared: list[dict[str, Any]] = []
        self.failure: RealtimeVideoError | None = None
        #: resumes a dropped connection when the start asked for it (`resumable=True`): up to
        #: `resume_attempts` times, waiting `resume_backoff`, 2×, 4×… seconds
        self._link = Reconnect(url, token, open_timeout, resume_attempts, resume_backoff)

    async def __aenter__(self) -> RealtimeVideoClient:
        headers = {"Authorization": f"Bearer {self._token}"} if self._token else None
        self._ws = await connect(self.url, additional_headers=headers, max_size=2**26, open_timeout=self._open_timeout)
        self._started = asyncio.get_running_loop().create_future()
        self._reader = asyncio.create_task(self._read())
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self._link.closing = True  # our own close: nothing to resume
        if self._reporter is not None:
            self._reporter.cancel()
            await asyncio.gather(self._reporter, return_exceptions=True)
        if self._ws is not None:
            await self._ws.close()
        if self._reader is not None:
            if self._link.reconnecting:
                self._reader.cancel()  # leaving: a resume under way is not waited for
            await asyncio.gather(self._reader, return_exceptions=True)

    # --- requests ------------------------------------------------------------------------
    async def start(self, prompt: str | None, **fields: Any) -> dict[str, Any]:
        """Send `session.start`; returns `video.start` (raises RealtimeVideoError if refused).
        A blend start: `start(None, prompts=[(text, weight), ...], interpolation="slerp")`."""
        assert self._started is not None, "use `async with`"
        scene = {} if prompt is None else {"prompt": prompt}
        if fields.get("prompts") is not None:
            fields["prompts"] = blend_prompts(fields["prompts"])
        await self._send({"type": protocol.START, **scene, **fields})
        return await self._started

    async def interact(
        self,
        prompt: str | None,
        transition_chunks: int | None = None,
        event_id: str | None = None,
        *,
        camera: Mapping[str, Any] | None = None,
        prompts: Sequence[tuple[str, float] | Mapping[str, Any]] | None = None,
        interpolation: str | None = None,
        timeout: float = 5.0,
        attempts: int = 3,
    ) -> dict[str, Any]:
        """Send a prompt update and return its `session.interaction.queued`. Without an ack in
        `timeout`, the same event id and payload are sent again (a retry is never applied twice),
        `attempts` times in all (then asyncio.TimeoutError). One refused `store_unavailable`
        (replicas whose shared store stalls: it was not applied) is sent again with the same event
        id after 0.2 s, 0.4 s, … (at most 2 s apart) for up to `store_retry_seconds` (10 s by
        default) from the first refusal; then RealtimeVideoError `store_unavailable` is raised
        (the interaction was never applied; it may be sent again later with the same event id).
        `camera` (with or without a prompt): `event.multi_modal_data.camera`, e.g. `camera_payload()`.
        `prompts` (in place of `prompt`) and `interpolation`: see `blend`."""
        event: dict[str, Any] = {} if prompt is None else {"prompt": prompt}
        if prompts is not None:
            event["prompts"] = blend_prompts(prompts)
        if camera is not None:
            event["multi_modal_data"] = {"camera": dict(camera)}
        interaction: dict[str, Any] = {"event_id": event_id or str(uuid.uuid4()), "event": event}
        if transition_chunks is not None:
            interaction["transition_chunks"] = transition_chunks
        if interpolation is not None:
            interaction["interpolation"] = interpolation
        eid = interaction["event_id"]
        if self.done is not None or self.failure is not None:  # over: no ack can come any more
            raise self._end_error()
        wait = self._acks.get(eid)
        if wait is None or wait.future.done():  # concurrent calls for one id share a pending future
            wait = self._acks[eid] = _AckWait(asyncio.get_running_loop().create_future())
        wait.waiters += 1
        loop = asyncio.get_running_loop()
        sent, backoff, refused_until = 0, STORE_BACKOFF_SECONDS, None
        try:
            while True:
                if wait.refused is None or wait.refused.done():
                    wait.refused = loop.create_future()
                refused = wait.refused
                await self._send({"type": protocol.INTERACTION, "interaction": interaction})
                await asyncio.wait((wait.future, refused), timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                if wait.future.done():
                    return wait.future.result()
                if not refused.done():  # no answer in `timeout`
                    sent += 1
                    if sent >= attempts:
                        raise asyncio.TimeoutError(f"no ack for {eid} after {sent} sends")
                    continue
                if refused_until is None:  # the retries are bounded from the first refusal
                    refused_until = loop.time() + self._store_retry_seconds
                if loop.time() + backoff > refused_until:
                    raise RealtimeVideoError(
                        ErrorCode.STORE_UNAVAILABLE.value,
                        f"the session store did not keep the interaction in {self._store_retry_seconds:g} s of "
                        "retries; it was not applied (send it again later with the same event_id)",
                        eid,
                    )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, STORE_BACKOFF_MAX)
        finally:
            wait.waiters -= 1
            if not wait.waiters and self._acks.get(eid) is wait:
                del self._acks[eid]

    async def camera(
        self, camera: Mapping[str, Any], transition_chunks: int | None = None, event_id: str | None = None
    ) -> dict[str, Any]:
        """A camera event (docs/protocol.md): `{"mode": "velocity"|"target", "data": {"translation":
        [x, y, z], "rotation": [x, y, z, w]}}`; returns its ack, like `interact`."""
        return await self.interact(None, transition_chunks, event_id, camera=camera)

    async def blend(
        self,
        prompts: Sequence[tuple[str, float] | Mapping[str, Any]],
        *,
        interpolation: str | None = None,
        transition_chunks: int | None = None,
        event_id: str | None = None,
    ) -> dict[str, Any]:
        """A weighted prompt blend (`event.prompts`, 2–8 `(text, weight)` pairs or `{text, weight}`
        objects, weights > 0) reached by `interpolation` (`"linear"` or `"slerp"`; None: the
        session's default); returns its ack, like `interact`. The generator must take blends
        (`video.start` `config.interactions`), else the ack is followed by `interaction_failed`."""
        return await self.interact(None, transition_chunks, event_id, prompts=prompts, interpolation=interpolation)

    async def stop(self) -> None:
        """Ask for the end: the stream then ends with the trailer and `session.done`."""
        await self._send({"type": protocol.STOP})

    async def revoke_steering(self) -> None:
        """End every steer link of a steerable session (docs/protocol.md §9.3); the token is retired
        for good. The answer, `session.steering_revoked` (how many), lands in `steering_revoked`."""
        await self._send({"type": protocol.REVOKE_STEERING})

    async def chunks(self) -> AsyncIterator[Chunk]:
        """Chunks as they arrive, until `session.done`; raises a session-ending error."""
        while (item := await self._chunks.get()) is not _END:
            yield item
        self._chunks.put_nowait(_END)  # a second iteration ends at once
        if self.failure is not None:
            raise self.failure

    async def save_mp4(self, path: str | Path) -> dict[str, Any] | None:
        """Write every chunk to `path` (a playable fragmented MP4); returns `session.done`."""
        with open(path, "wb") as f:
            async for chunk in self.chunks():
                f.write(chunk.data)
        return self.done

    async def playback(self, position_seconds: float, buffered_seconds: float | None = None) -> None:
        """Send one playhead report (`session.playback`): never answered while within the rate."""
        message: dict[str, Any] = {"type": protocol.PLAYBACK, "position_seconds": position_seconds}
        if buffered_seconds is not None:
            message["buffered_seconds"] = buffered_seconds
        await self._send(message)

    async def _report_playback(self, every: float) -> None:
        """Reports from the virtual playhead until the session is over or the socket closes."""
        loop = asyncio.get_running_loop()
        try:
            while self.done is None and self.failure is None:
                await self._send(self.playhead.report(loop.time()))
                await asyncio.sleep(every)
        except ConnectionClosed:
            pass

    async def _send(self, message: dict[str, Any]) -> None:
        assert self._ws is not None, "use `async with`"
        while True:
            ws = self._ws
            try:
                await ws.send(json.dumps(message))
                return
            except ConnectionClosed:
                if not await self._wait_reattached(ws):
                    raise

    # --- receiving -----------------------------------------------------------------------
    async def _read(self) -> None:
        assert self._ws is not None
        metadata: dict[str, Any] | None = None
        try:
            while True:  # one more turn per resumed connection
                try:
                    async for frame in self._ws:
                        if isinstance(frame, bytes):
                            if metadata is not None and self._link.fresh(metadata):
                                seconds = VirtualPlayhead.chunk_seconds(metadata, self.video_start)
                                self.playhead.received(seconds, asyncio.get_running_loop().time())
                                self._chunks.put_nowait(Chunk(metadata, frame))
                            metadata = None
                            continue
                        message = json.loads(frame)
                        if message.get("type") == protocol.CHUNK_METADATA:
                            metadata = message
                        else:
                            self._dispatch(message)
                except ConnectionClosed:
                    pass
                metadata = None
                if self.done is not None or self.failure is not None or not await self._resume():
                    break
        finally:
            if self.done is None and self.failure is None:
                self.failure = RealtimeVideoError("connection_closed", "the connection closed before session.done")
            self._settle()

    # --- resume after a dropped connection (rtvideo.client.reconnect) ----------------------
    @property
    def reconnecting(self) -> bool:
        """True while a dropped connection is being resumed."""
        return self._link.reconnecting

    @property
    def resumes(self) -> int:
        """Connections resumed so far."""
        return self._link.resumes

    @property
    def awaiting_acks(self) -> tuple[str, ...]:
        """The event ids of the interactions waiting for their ack now."""
        return tuple(self._acks)

    async def _resume(self) -> bool:
        """The connection dropped before session.done: resume it (True) or give up (False)."""
        token = (self.video_start or {}).get("resume_token")
        if not token or not self._link.may_resume():
            return False
        resumed = await self._link.resume(token)
        if self._link.closing:  # the caller left while it resumed: the new connection goes too
            if not isinstance(resumed, RealtimeVideoError):
                await resumed[0].close()
            return False
        if isinstance(resumed, RealtimeVideoError):
            self.failure = resumed
            return False
        assert self.video_start is not None
        self._ws, new_token = resumed
        self.video_start = {**self.video_start, "resume_token": new_token}
        self._link.reattached()
        return True

    async def _wait_reattached(self, dropped: ClientConnection) -> bool:
        """A send met a dropped connection: wait for the resume; True when there is a new one."""
        if not (self.video_start or {}).get("resume_token") or self._link.closing:
            return False
        await self._link.wait(lambda: self._ws is dropped and self.done is None and self.failure is None)
        return self._ws is not dropped

    def _dispatch(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == protocol.VIDEO_START:
            self.video_start = message
            self._resolve(self._started, message)
            if self._report_every and self._reporter is None:
                self._reporter = asyncio.get_running_loop().create_task(self._report_playback(self._report_every))
        elif kind == protocol.QUEUED:
            wait = self._acks.get(message["event_id"])
            self._resolve(wait.future if wait is not None else None, message)
        elif kind == protocol.STEERING_REVOKED:
            self.steering_revoked = message
        elif kind == protocol.INTERACTION_SHARED:
            self.shared.append(message)
        elif kind == protocol.DONE:
            self.done = message
            self._settle()
        elif kind == protocol.ERROR:
            error = RealtimeVideoError.from_message(message)
            waiting = self._acks.get(error.event_id or "")
            if error.code in _ENDING:
                self.failure = error
                self._wake(error)  # no video.start or ack comes after it; done may be late or never
            elif waiting is not None and error.code in _INTERACTION_REJECTED:
                if not waiting.future.done():
                    waiting.future.set_exception(error)
            elif waiting is not None and error.code == ErrorCode.STORE_UNAVAILABLE.value:
                if waiting.refused is not None and not waiting.refused.done():
                    waiting.refused.set_result(None)  # `interact` sends it again (never applied)
            else:
                self._on_error(error)

    def _settle(self) -> None:
        """The session is over: wake everything that waits on it."""
        self._wake(self._end_error())
        self._chunks.put_nowait(_END)

    def _end_error(self) -> RealtimeVideoError:
        return self.failure or RealtimeVideoError("session_done", "the session ended")

    def _wake(self, end: RealtimeVideoError) -> None:
        """Fail `start()` and every `interact()` still waiting."""
        for future in [self._started, *(wait.future for wait in self._acks.values())]:
            if future is not None and not future.done():
                future.set_exception(end)

    @staticmethod
    def _resolve(future: asyncio.Future | None, value: dict[str, Any]) -> None:
        if future is not None and not future.done():
            future.set_result(value)
