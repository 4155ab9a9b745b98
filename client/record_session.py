"""One `rtvideo record` session over `WebSocket /v1/realtime/video`: connect, send
`session.start` and the scheduled updates, receive into a `Recording`, resume a dropped
connection, and stop on Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from rtvideo.client.recording import Recording
from rtvideo.core import protocol
from rtvideo.core.resume import RESUME
from rtvideo.proxy.tasks import TaskSet  # asyncio only: no proxy dependency

ENDPOINT = "/v1/realtime/video"
#: after Ctrl-C (session.stop), how long to wait for session.done before giving up
STOP_WAIT_SECONDS = 15.0
#: the first wait before a resume attempt; each further attempt waits twice as long
RESUME_BACKOFF_SECONDS = 0.25


def endpoint(url: str) -> str:
    """A bare `ws://host:port` gets the protocol's path."""
    parts = urlsplit(url)
    if parts.path in ("", "/"):
        parts = parts._replace(path=ENDPOINT)
    return urlunsplit(parts)


def start_message(args: argparse.Namespace) -> dict[str, Any]:
    """The session.start the command line asks for."""
    start: dict[str, Any] = {"type": protocol.START, "prompt": args.prompt}
    for name in ("seconds", "num_frames", "width", "height", "fps", "seed"):
        if getattr(args, name) is not None:
            start[name] = getattr(args, name)
    if getattr(args, "image_reference", None) is not None:
        start["image_reference"] = {"image_url": args.image_reference}
    if getattr(args, "metrics", False):
        start["metrics"] = True  # session.metrics, written beside the video (record_output.metrics_path)
    if getattr(args, "record", False):
        start["record"] = True  # the server keeps the session too (docs/recordings.md)
    return start


async def record_session(args: argparse.Namespace, say: Callable[[str], None]) -> Recording:
    """Run one session to its end (or Ctrl-C), returning what arrived."""
    url = endpoint(args.url)
    rec = Recording(url)
    start = start_message(args)
    headers = {"Authorization": f"Bearer {args.token}"} if args.token else None
    loop = asyncio.get_running_loop()
    tasks = TaskSet()
    ws: ClientConnection | None = None
    send_lock = asyncio.Lock()

    async def send(message: dict[str, Any]) -> None:
        assert ws is not None
        async with send_lock:
            await ws.send(json.dumps(message))
            rec.sent(message)

    def spawn(coro: Any) -> None:
        tasks.spawn(coro)

    async def stop_then_give_up() -> None:
        if ws is None:  # not connected yet: the stop follows the start
            return
        if rec.done is None:
            try:
                await send({"type": protocol.STOP})
            except ConnectionClosed:
                return
        await asyncio.sleep(STOP_WAIT_SECONDS)
        say(f"no session.done {STOP_WAIT_SECONDS:.0f} s after session.stop; closing")
        await ws.close()

    def on_sigint() -> None:
        if not rec.interrupted:
            rec.interrupted = True
            say("interrupted: session.stop sent, waiting for session.done (Ctrl-C again to quit now)")
            spawn(stop_then_give_up())
        elif ws is not None:
            say("quitting without session.done")
            spawn(ws.close())

    async def run_updates(updates: list[tuple[float, dict[str, Any]]], video_started: float) -> None:
        for at, interaction in updates:
            delay = video_started + at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            if rec.interrupted or rec.done is not None:
                return
            await send({"type": protocol.INTERACTION, "interaction": interaction})
            rec.unsent.remove(interaction["event_id"])

    async def report_playback(every: float) -> None:
        try:
            while rec.done is None and not rec.interrupted:
                await send(rec.playhead.report(time.monotonic()))
                await asyncio.sleep(every)
        except ConnectionClosed:
            pass  # the session is over: what arrived is saved

    updates: list[tuple[float, dict[str, Any]]] = []
    for number, update in enumerate(sorted(args.update, key=lambda u: u.at), 1):
        interaction: dict[str, Any] = {"event_id": f"update-{number}", "event": {"prompt": update.prompt}}
        if update.transition_chunks is not None:
            interaction["transition_chunks"] = update.transition_chunks
        updates.append((update.at, interaction))
    for number, move in enumerate(sorted(getattr(args, "camera", []), key=lambda c: c.at), 1):
        updates.append(
            (move.at, {"event_id": f"camera-{number}", "event": {"multi_modal_data": {"camera": move.camera}}})
        )
    updates.sort(key=lambda item: item[0])  # stable: prompt updates first at equal times
    rec.unsent = [interaction["event_id"] for _, interaction in updates]
    loop.add_signal_handler(signal.SIGINT, on_sigint)
    attempts = getattr(args, "resume_attempts", 0) or 0
    if attempts > 0:
        start["resumable"] = True  # a dropped connection is resumed (docs/protocol.md §9.1)
    try:
        ws = await connect(url, additional_headers=headers, max_size=None, open_timeout=10)
        rec.origin, rec.started_wall = time.monotonic(), time.time()
        await send(start)
        if rec.interrupted:
            spawn(stop_then_give_up())
        while True:  # one turn per connection: the first, then each resumed one
            try:
                async for frame in ws:
                    if isinstance(frame, bytes):
                        rec.received_binary(frame, say)
                        continue
                    try:
                        message = json.loads(frame)
                    except ValueError:
                        say(f"not JSON from the server: {frame[:80]!r}")
                        continue
                    rec.received_text(message, say)
                    if message.get("type") == protocol.VIDEO_START and updates:
                        spawn(run_updates(updates, time.monotonic()))
                    if message.get("type") == protocol.VIDEO_START and getattr(args, "report_playback", None):
                        spawn(report_playback(args.report_playback))
                    if rec.done is not None:
                        break
            except ConnectionClosed:
                pass
            if rec.done is not None or rec.interrupted or attempts <= 0:
                break
            resumed = await resume_recording(url, headers, rec, attempts, say)
            if resumed is None:
                break
            ws = resumed
    except (ConnectionClosed, OSError, InvalidHandshake):
        if ws is None:
            raise
        # what arrived is saved; `complete` says whether it is everything
    finally:
        if ws is not None:
            await ws.close()
        loop.remove_signal_handler(signal.SIGINT)
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*list(tasks), return_exceptions=True)
    return rec


async def resume_recording(
    url: str, headers: dict[str, str] | None, rec: Recording, attempts: int, say: Callable[[str], None]
) -> ClientConnection | None:
    """The connection dropped before session.done: resume it (docs/protocol.md §9.1) up to
    `attempts` times, waiting 0.25 s, 0.5 s, 1 s… between; None when it cannot be resumed."""
    token = (rec.video_start or {}).get("resume_token")
    if not token:
        return None
    for attempt in range(attempts):
        await asyncio.sleep(RESUME_BACKOFF_SECONDS * 2**attempt)
        say(f"connection lost after chunk {rec.last_index}: resuming ({attempt + 1}/{attempts})")
        try:
            ws = await connect(url, additional_headers=headers, max_size=None, open_timeout=10)
            resume = {"type": RESUME, "resume_token": token, "last_transport_chunk_index": rec.last_index}
            await ws.send(json.dumps(resume))
            first = json.loads(await asyncio.wait_for(ws.recv(), 10))
        except (OSError, ConnectionClosed, InvalidHandshake, asyncio.TimeoutError, ValueError):
            continue
        if first.get("type") == protocol.VIDEO_START and first.get("resumed"):
            rec.received_text(first, say)
            return ws
        await ws.close()
        if first.get("type") == protocol.ERROR and "attached" in str(first.get("message")):
            continue  # the server has not seen the old connection go yet
        rec.received_text(first, say)
        rec.failure = first
        return None
    say(f"could not resume after {attempts} attempts")
    return None
