"""Which of our files a path through the proxy executes, found by running it: a profile hook on
the proxies' loop thread records every call into `proxy/` and `rtvideo/` with the asyncio task it
ran in, and the messages a client saw go into the same log, so that a walk can be cut from it
(docs/architecture.md "Two walks, as they execute"; tests/e2e/test_walks.py)."""

from __future__ import annotations

import asyncio
import itertools
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import rtvideo
import rtvideo.proxy

#: where the packages a walk names were imported from, the proxy's first (it may sit inside
#: rtvideo's folder when installed), and the folder each is in this repository
PLACES = (
    (str(Path(rtvideo.proxy.__file__).parent) + "/", "proxy/"),
    (str(Path(rtvideo.__file__).parent) + "/", "rtvideo/"),
)
OURS = tuple(place for place, _ in PLACES)


def in_repo(filename: str) -> str:
    """A file of ours as the repository names it (`proxy/session/upstream.py`), wherever it was
    imported from (the checkout, or an installed copy)."""
    return next(folder + filename[len(place) :] for place, folder in PLACES if filename.startswith(place))


@dataclass(frozen=True)
class Call:
    seq: int
    task: int  # id of the asyncio task it ran in; 0 outside any task (a loop callback)
    file: str  # relative to the repository's root
    function: str
    marked: str = ""  # the mark `Trace.marks` gave this call, if any


@dataclass
class Trace:
    """A profile hook for the thread that runs the proxies' loop. `marks`: label → (a function's
    name, its local, the texts that local must hold): a call whose local holds them all is marked
    with the label (the frame read from the socket, the reply that names the update)."""

    marks: dict[str, tuple[str, str, tuple[str, ...]]] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    notes: list[tuple[int, str]] = field(default_factory=list)
    parents: dict[int, int] = field(default_factory=dict)  # task → the task that created it
    _tasks: list[asyncio.Task[Any]] = field(default_factory=list)  # held, so that no id is reused
    _seq: Any = field(default_factory=itertools.count)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def hook(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        code = frame.f_code
        if not code.co_filename.startswith(OURS):
            return
        try:
            task = asyncio.current_task()
        except RuntimeError:
            task = None
        marked = ""
        for label, (function, local, needles) in self.marks.items():
            if code.co_name == function:
                text = str(frame.f_locals.get(local, ""))[:100_000]
                if all(n in text for n in needles):
                    marked = label
        rel = in_repo(code.co_filename)
        if task is not None:
            self._tasks.append(task)
        with self._lock:
            self.calls.append(Call(next(self._seq), id(task) if task else 0, rel, code.co_qualname, marked))

    def note(self, what: str) -> None:
        """A client's observation, in the calls' order (from any thread)."""
        with self._lock:
            self.notes.append((next(self._seq), what))

    def at(self, what: str) -> int:
        return next(seq for seq, note in self.notes if note == what)

    def _task(self, loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        parent = asyncio.current_task(loop)
        task = asyncio.Task(coro, loop=loop, **kwargs)
        self._tasks.append(task)
        if parent is not None:
            self._tasks.append(parent)
            self.parents[id(task)] = id(parent)
        return task

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        def on() -> None:
            loop.set_task_factory(self._task)
            sys.setprofile(self.hook)

        _on_loop(loop, on)

    def stop(self, loop: asyncio.AbstractEventLoop) -> None:
        def off() -> None:
            sys.setprofile(None)
            loop.set_task_factory(None)

        _on_loop(loop, off)

    def steps(self) -> list[list[Call]]:
        """The calls cut where the task changes: what one task did before it gave way."""
        out: list[list[Call]] = []
        for call in self.calls:
            if out and out[-1][-1].task == call.task:
                out[-1].append(call)
            else:
                out.append([call])
        return out

    def root(self, task: int) -> str:
        """The function a task began in: its oldest ancestor's first call seen here."""
        while task in self.parents:
            task = self.parents[task]
        return next((c.function for c in self.calls if c.task == task), "")


def _on_loop(loop: asyncio.AbstractEventLoop, do: Any) -> None:
    done = threading.Event()

    def run() -> None:
        do()
        done.set()

    loop.call_soon_threadsafe(run)
    assert done.wait(10)


def files_in_order(calls: list[Call]) -> list[str]:
    """Each file once, where it is first executed."""
    return list(dict.fromkeys(c.file for c in calls))


#: loops every proxy runs on a timer, whether or not anything is walking through it: they run in a
#: walk's window but are not the walk (renewing the replica's advertisement, its leases and its
#: slot shares; probing the Tritons; watching the store)
PERIODIC = frozenset(
    {"Advertisement._renew", "StoreKeeper._renew_all", "SlotShares._renew_all", "Supervisor._run", "StoreWatch._watch"}
)


def _after(steps: list[list[Call]], i: int, function: str) -> list[Call]:
    """The first step after step `i` that begins in `function`."""
    return next(steps[j] for j in range(i + 1, len(steps)) if steps[j][0].function == function)


def _reply_of(steps: list[list[Call]], label: str) -> tuple[int, list[Call]]:
    """The pump's handling of the one reply marked `label`: from the pump's resumption before it
    to the next."""
    i = next(i for i, step in enumerate(steps) if any(c.marked == label for c in step))
    step = steps[i]
    at = next(k for k, c in enumerate(step) if c.marked == label)
    begin = max((k for k in range(at + 1) if step[k].function == "Upstream._pump"), default=0)
    end = next((k for k in range(at + 1, len(step)) if step[k].function == "Upstream._pump"), len(step))
    return i, step[begin:end]


def prompt_update_walk(trace: Trace) -> dict[str, list[Call]]:
    """`in`: the owner's frame read from the socket until the request leaves for Triton (the step
    that read it, then the gRPC request iterator's next step). `back`: the owner's outbox writing
    the proxy's ack, the pump taking the model's answer to the request, the pump taking the first
    chunk that names the update and the outbox writing it."""
    steps = trace.steps()
    i = next(i for i, step in enumerate(steps) if any(c.marked == "frame" for c in step))
    read = steps[i][next(k for k, c in enumerate(steps[i]) if c.marked == "frame") :]
    into = read + _after(steps, i, "TritonStream._request_iterator")
    ack = _after(steps, i, "Outbox._run")
    _, answer = _reply_of(steps, "answer")
    c, chunk = _reply_of(steps, "chunk")
    return {"in": into, "back": ack + answer + chunk + _after(steps, c, "Outbox._run")}


def takeover_walk(new: Trace, old: Trace, until: str) -> dict[str, list[Call]]:
    """`in`: at the replica the resume reached, from its connection until the session's start
    request leaves for Triton; `out`: from there until the note `until` (the first chunk at the
    client); `old`: what the replica that held the session did meanwhile. The periodic loops
    (PERIODIC) and the tasks they started are left out."""

    def walk(trace: Trace) -> list[Call]:
        roots = {task: trace.root(task) for task in {c.task for c in trace.calls}}
        return [c for c in trace.calls if roots[c.task] not in PERIODIC]

    calls = [c for c in walk(new) if c.seq < new.at(until)]
    sent = next(k for k, c in enumerate(calls) if c.function == "TritonStream._request_iterator")
    return {"in": calls[: sent + 1], "out": calls[sent + 1 :], "old": walk(old)}
