"""Randomised steering for the chunk-list invariants (docs/protocol.md §6): a seeded script of
prompt updates and camera moves (target, velocity, back to start), retries of an earlier event
(the same id and payload: acked again) and conflicts (an earlier id with another payload:
`event_id_conflict`), sent through the proxy or over direct gRPC; and the check that every
acked event reaches exactly one end."""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from typing import Any

from tests.support.proxy_client import Ws
from tests.support.streams import Transcript, check_stream_rules, event_ends


@dataclass(frozen=True)
class Step:
    event_id: str
    event: dict[str, Any]
    transition_chunks: int | None
    delay: float  # seconds before it is sent
    conflict: bool = False  # an earlier id with another payload

    def interaction(self) -> dict[str, Any]:
        out: dict[str, Any] = {"event_id": self.event_id, "event": self.event}
        if self.transition_chunks is not None:
            out["transition_chunks"] = self.transition_chunks
        return out


def camera(mode: str, translation: list[float], yaw: float = 0.0) -> dict[str, Any]:
    import math

    rotation = [0.0, math.sin(yaw / 2), 0.0, math.cos(yaw / 2)]
    return {"multi_modal_data": {"camera": {"mode": mode, "data": {"translation": translation, "rotation": rotation}}}}


def random_script(seed: int, kinds: tuple[str, ...], steps: int = 10, max_delay: float = 0.25) -> list[Step]:
    """`kinds` among "prompt", "target", "velocity", "home"; retries and conflicts mixed in."""
    rng = random.Random(seed)
    script: list[Step] = []
    for n in range(steps):
        delay = rng.uniform(0, max_delay)
        roll = rng.random()
        if script and roll < 0.15:  # a retry: the same id and payload
            earlier = rng.choice([s for s in script if not s.conflict])
            script.append(Step(earlier.event_id, earlier.event, earlier.transition_chunks, delay))
            continue
        if script and roll < 0.25:  # a conflict: an earlier id, another payload
            earlier = rng.choice([s for s in script if not s.conflict])
            other = {"prompt": f"conflict {n}"} if "prompt" in kinds else camera("target", [0.0, 0.0, 9.0])
            if other != earlier.event:
                script.append(Step(earlier.event_id, other, earlier.transition_chunks, delay, conflict=True))
                continue
        kind = rng.choice(kinds)
        chunks = rng.choice([None, 0, 1, 2, 3])
        if kind == "prompt":
            event = {"prompt": rng.choice(["a harbour at dawn", "snow on a field", "a city at night", "rain"])}
        elif kind == "target":
            event = camera(
                "target", [round(rng.uniform(-1, 1), 2), 0.0, round(rng.uniform(0, 2), 2)], rng.uniform(-1, 1)
            )
        elif kind == "velocity":
            event = camera("velocity", [0.0, 0.0, round(rng.uniform(0.1, 1), 2)], rng.uniform(-0.3, 0.3))
        else:  # back to start
            event = camera("target", [0.0, 0.0, 0.0])
        script.append(Step(f"{kind}-{n}", event, chunks, delay))
    return script


async def run_through_proxy(s: Ws, script: list[Step], settle: float) -> Transcript:
    """Each step after its delay, then `settle` seconds, then session.stop; the transcript."""
    for step in script:
        await asyncio.sleep(step.delay)
        await s.send({"type": "session.interaction", "interaction": step.interaction()})
    await asyncio.sleep(settle)
    await s.send({"type": "session.stop"})
    return await s.finish(120)


def run_over_grpc(session: Any, script: list[Step], settle: float) -> Transcript:
    """As `run_through_proxy`, on a started `TritonStreamSession`; the transcript."""
    t = Transcript()
    for step in script:
        time.sleep(step.delay)
        session.interact(event_id=step.event_id, transition_chunks=step.transition_chunks, event=step.event)
    time.sleep(settle)
    session.stop()
    deadline = time.monotonic() + 120
    while True:
        reply = session.next(max(0.1, deadline - time.monotonic()))
        t.add(reply.message, reply.data)
        if reply.message is not None and reply.message.get("type") == "session.done":
            return t


def check_steered(t: Transcript, script: list[Step], refused: frozenset[str] = frozenset()) -> dict[str, int]:
    """The stream's rules (the chunk-list invariants included); each conflict answered
    `event_id_conflict`, every other step acked; every acked event in exactly one end (or
    failed with `interaction_failed` when its kind is in `refused`). Returns counts."""
    check_stream_rules(t)
    acked = {m["event_id"] for m in t.of_type("session.interaction.queued")}
    errors = t.of_type("error")
    conflicts = [e for e in errors if e["code"] == "event_id_conflict"]
    assert len(conflicts) == sum(s.conflict for s in script), (conflicts, script)
    assert acked == {s.event_id for s in script if not s.conflict}, (acked, script)
    failed = {e["event_id"] for e in errors if e["code"] == "interaction_failed"}
    ends = event_ends(t)
    assert sorted(ends) == sorted(acked - failed), (ends, acked, failed)
    assert not failed or {s.event_id.split("-")[0] for s in script if s.event_id in failed} <= refused, failed
    return {"chunks": len(t.media), "acked": len(acked), "failed": len(failed), "conflicts": len(conflicts)}
