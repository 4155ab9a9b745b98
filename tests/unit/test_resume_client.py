"""The resume tests' client stops reading when told to (issue 39 item 8).

tests/e2e/test_resume.py::test_forged_used_and_attached_tokens_are_refused lets the owner read
all along in a task, cancels it, then drops the owner's connection. Read through
`asyncio.wait_for`, a cancel that came in the loop turn a frame arrived was swallowed on CPython
3.10 and 3.11 (gh-86296): on a busy stream, under load, the reader read on, the test waited for
it until its own 120 s timeout, and the connection it meant to drop stayed open until then (what
the proxy saw: an owner whose drop came minutes late). No proxy and no socket here: a stand-in
connection whose frames arrive when the test says."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.support.resume_client import Leg, within

PONG = json.dumps({"type": "session.pong"})


class _Frames:
    """What `Leg` reads of a `ClientConnection`: `recv()`, here from a queue."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[str | bytes] = asyncio.Queue()

    async def recv(self) -> str | bytes:
        return await self.queue.get()


def test_a_reading_task_ends_at_a_cancel_that_comes_with_a_frame() -> None:
    async def body() -> tuple[bool, int]:
        frames = _Frames()
        leg = Leg(frames)  # type: ignore[arg-type]

        async def read_on() -> None:  # as the owner of test_forged_used_and_attached_tokens_are_refused
            while True:
                await leg.read()

        reading = asyncio.ensure_future(read_on())
        frames.queue.put_nowait(PONG)
        while not leg.messages:  # it reads ...
            await asyncio.sleep(0)
        await asyncio.sleep(0)  # ... and waits for the next frame
        frames.queue.put_nowait(PONG)  # a frame arrives
        reading.cancel()  # in the same loop turn as the cancel
        await asyncio.wait({reading}, timeout=1.0)
        ended = reading.done()
        reading.cancel()  # (without the fix: stop it for good before the loop closes)
        await asyncio.gather(reading, return_exceptions=True)
        return ended, len(leg.messages)

    ended, read = asyncio.run(asyncio.wait_for(body(), 10))
    assert ended, "the reading task survived its cancel() and read on"
    assert read == 1  # the frame that came with the cancel is not taken for read


def test_a_read_still_times_out_and_the_next_read_gets_the_next_frame() -> None:
    async def body() -> None:
        frames = _Frames()
        leg = Leg(frames)  # type: ignore[arg-type]
        with pytest.raises(asyncio.TimeoutError):
            await leg.read(timeout=0.05)
        frames.queue.put_nowait(PONG)
        assert await leg.read(timeout=1.0) == {"type": "session.pong"}
        assert await within(asyncio.sleep(0, result=7), 1.0) == 7

    asyncio.run(asyncio.wait_for(body(), 10))
