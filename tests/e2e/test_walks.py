"""The two walks docs/architecture.md draws, run as they execute: a prompt update and a takeover
through real proxies, the session's real Triton and a real Redis, under a profile hook on the
proxies' loop (tests/support/execution_trace.py). The proxy files a prompt update executes are
the ones the doc lists for it, in and back."""

from __future__ import annotations

import asyncio
import os
import re
import time
from typing import Any

from tests.support.execution_trace import (
    OURS,
    Call,
    Trace,
    files_in_order,
    in_repo,
    prompt_update_walk,
    takeover_walk,
)
from tests.support.paths import REPO_ROOT
from tests.support.proxy_client import Ws, ws
from tests.support.proxy_host import ProxyHost, run, wait_idle
from tests.support.replica_servers import replica_servers
from tests.support.resume_client import Leg
from tests.support.streams import PACED_MODEL

MARK = "walk-prompt-5b1e"
#: what runs only when something logs
LOGGING = frozenset({"rtvideo/logsetup.py", "rtvideo/redaction.py"})
DOC = REPO_ROOT / "docs" / "architecture.md"


def doc_walk(title: str) -> list[str]:
    """The files of the fenced block in docs/architecture.md whose first line begins `title`."""
    for block in re.findall(r"```text\n(.*?)```", DOC.read_text(), re.S):
        if block.startswith(title):
            return re.findall(r"\b((?:proxy|rtvideo)/[\w/]+\.py)\b", block)
    raise AssertionError(f"docs/architecture.md has no walk {title!r}")


def show(title: str, calls: list[Call]) -> str:
    """A walk as the doc writes it: each file once, where it is first executed, with the first
    six functions it ran there."""
    functions: dict[str, list[str]] = {}
    for call in calls:
        names = functions.setdefault(call.file, [])
        short = call.function.split(".<locals>")[0].rsplit(".", 1)[-1]
        if short not in names and not short.startswith("<"):
            names.append(short)
    files = files_in_order(calls)
    ours = [f for f in files if f.startswith("proxy/")]
    lines = [f"{title}: {len(ours)} proxy files, {len(files) - len(ours)} of rtvideo/"]
    lines += [f"{n:3} {f:42} {', '.join(functions[f][:6])}" for n, f in enumerate(files, 1)]
    return "\n".join(lines)


def keep(title: str, calls: list[Call], checked: str | None) -> None:
    """The walk `title` as run: with WALKS_WRITE set, written into docs/architecture.md's block
    of that title; then, unless `checked` is None, its files under `checked` are the doc's."""
    if os.environ.get("WALKS_WRITE"):
        block = re.compile(r"```text\n" + re.escape(title) + r":.*?```", re.S)
        text = DOC.read_text()
        assert block.search(text), f"docs/architecture.md has no walk {title!r}"
        DOC.write_text(block.sub(lambda _: f"```text\n{show(title, calls)}\n```", text, count=1))
    if checked is not None:
        executed = sorted({c.file for c in calls if c.file.startswith(checked)})
        listed = sorted({f for f in doc_walk(title) if f.startswith(checked)})
        assert executed == listed, f"{title}: run {executed}, docs/architecture.md {listed}"


def test_a_prompt_update_executes_the_files_the_doc_lists(proxies, triton) -> None:
    wait_idle(triton)
    url = proxies.url()
    trace = Trace(
        marks={
            "frame": ("on_message", "message", (MARK,)),
            "answer": ("on_reply", "reply", (MARK,)),
            "chunk": ("on_reply", "reply", (MARK, "video.chunk_metadata", "started_event_ids")),
        }
    )

    async def body() -> None:
        async with ws(url) as conn:
            s = Ws(conn)
            await s.start("A quiet harbour at dawn", num_frames=400, seed=7)
            await s.next_media()
            trace.start(proxies.loop)
            try:
                await s.interact("a storm over the harbour", MARK)
                await s.until(lambda m: m["type"] == "session.interaction.queued" and m["event_id"] == MARK)
                await s.until(lambda m: m["type"] == "video.chunk_metadata" and MARK in m["started_event_ids"])
            finally:
                trace.stop(proxies.loop)
            await s.send({"type": "session.stop"})
            await s.until("session.done", timeout=60)

    run(body())
    walk = prompt_update_walk(trace)
    keep("prompt update, in", walk["in"], "proxy/")
    keep("prompt update, back", walk["back"], "proxy/")


def test_a_takeover_walk(triton: Any, redis_url: str) -> None:
    """A resume reaching a replica that does not hold the session (its owner's link dropped at
    the other): written into the doc when WALKS_WRITE is set; the proxy files the new holder
    executes on the way in are the doc's."""
    wait_idle(triton, PACED_MODEL)
    hosts = {"old": ProxyHost(triton.grpc_url), "new": ProxyHost(triton.grpc_url)}
    shared = {"model": PACED_MODEL, "session_store": redis_url}
    traces = {name: Trace(marks={}) for name in hosts}
    try:
        with (
            replica_servers(hosts["old"], count=1, **shared) as (old,),
            replica_servers(hosts["new"], count=1, **shared) as (new,),
        ):

            async def body() -> None:
                first = await Leg.open(old.url)
                start = await first.start("a lighthouse", num_frames=4000, seed=5, width=128, height=96)
                await first.media(2)
                first.drop()
                await asyncio.sleep(2.0)  # the old replica has seen the link go: one resume, not refused
                for name, host in hosts.items():
                    traces[name].start(host.loop)
                try:
                    second, resumed = await Leg.resumed(new.url, start["resume_token"], first.last_index)
                    assert resumed["type"] == "video.start" and resumed["resumed"] is True, resumed
                    await second.media(1)
                    traces["new"].note("media")
                    await asyncio.sleep(1.0)  # the old replica lets go
                finally:
                    for name, host in hosts.items():
                        traces[name].stop(host.loop)
                await second.send({"type": "session.stop"})
                await second.until("session.done", timeout=60)

            run(body(), timeout=180)
    finally:
        for host in hosts.values():
            host.close()
    walk = takeover_walk(traces["new"], traces["old"], "media")
    keep("takeover, in", walk["in"], "proxy/")
    keep("takeover, out", walk["out"], None)  # how far the pump got before the client read is timing
    keep("takeover, old", walk["old"], None)


def test_the_model_side_of_a_prompt_update() -> None:
    """The model's part of the walk, run in this process: the runtime the model's `execute()`
    hands each request to (RequestDispatcher, then SessionManager) with the built-in generator
    rendering in process, as the tests' fast model does; traced on every thread from the update's
    submission until the first chunk that names it has been sent (the next chunk's send ends it). model.py's `execute()` and the
    response sender around it are Triton's stub and are read, not run (the doc says so)."""
    import json
    import sys
    import threading

    from rtvideo.backend.loading.assembly import build_manager
    from rtvideo.backend.loading.settings import BackendSettings
    from rtvideo.backend.runtime.dispatch import RequestDispatcher
    from tests.support.recorder import Recorder

    calls: list[tuple[float, str, str, str]] = []

    def hook(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename.startswith(OURS):
            file = in_repo(frame.f_code.co_filename)
            calls.append((time.monotonic(), threading.current_thread().name, file, frame.f_code.co_qualname))

    named = threading.Event()
    times: dict[str, float] = {}

    class Chunks(Recorder):
        def send(self, message: Any, data: bytes = b"", *, final: bool = False) -> None:
            if message and message.get("kind") == "media" and "named" in times and not named.is_set():
                times["chunk"] = time.monotonic()  # the chunk after it: the named one's sending is done
                named.set()
            if message and MARK in message.get("started_event_ids", ()):
                times["named"] = time.monotonic()
            super().send(message, data, final=final)

    threading.setprofile(hook)
    sys.setprofile(hook)
    try:
        manager = build_manager(
            BackendSettings(width=64, height=64, render_workers=0, max_sessions=2), "realtime_video"
        )
        dispatcher = RequestDispatcher(manager.on_request)
        manager.serve_on(dispatcher.call_soon)
        secret = "walk-secret-0123456789"  # at least 16 characters (docs/protocol.md §8)
        start = {"type": "session.start", "prompt": "a quiet harbour", "num_frames": 400, "seed": 7}
        chunks = Chunks()
        dispatcher.submit(1, json.dumps(start).encode(), start=True, end=False, channel=chunks, secret=secret)
        deadline = time.monotonic() + 60
        while sum(1 for m, _, _ in chunks.sent if m and m.get("kind") == "media") < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        update = {"type": "session.interaction", "interaction": {"event_id": MARK, "event": {"prompt": "a storm"}}}
        times["sent"] = time.monotonic()
        dispatcher.submit(1, json.dumps(update).encode(), start=False, end=False, channel=Recorder(), secret=secret)
        assert named.wait(60)
    finally:
        threading.setprofile(None)
        sys.setprofile(None)
    dispatcher.submit(1, b'{"type": "session.stop"}', start=False, end=True, channel=Recorder(), secret=secret)
    dispatcher.close()
    manager.shutdown()
    # in the order the request went: submitted (this thread), handled (the dispatch thread), then
    # the session's own thread, which admits it at a chunk boundary and renders and sends the chunk
    first = {"MainThread": 0, "request-dispatch": 1}
    during = [c for c in calls if times["sent"] <= c[0] <= times["chunk"]]
    during.sort(key=lambda c: (first.get(c[1], 2), c[0]))
    # a log line (a chunk late on a loaded machine) runs the log format and redaction: not the
    # update's path, and only sometimes, so left out of the walk
    window = [Call(0, 0, file, function) for _, _, file, function in during if file not in LOGGING]
    keep("prompt update, model", window, "rtvideo/")
