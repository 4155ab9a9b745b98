"""Camera events through the session runtime: the built-in source renders each frame's pose and
reports camera events beside prompt events; a modality the generator does not register is acked,
then failed with `interaction_failed` naming it, before the source sees it; every camera event
reaches one visible end (a chunk list, or session.done's)."""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest

from rtvideo.backend import catalog
from rtvideo.backend.loading.settings import BackendSettings
from rtvideo.backend.runtime.manager import SessionManager
from rtvideo.backend.runtime.session import Limits
from rtvideo.backend.runtime.sources import GeneratorChunkSource, Interaction, RenderedChunk
from rtvideo.core.interaction.registry import UnhandledKinds
from rtvideo.core.interaction.types import InteractionRequest
from rtvideo.core.pose import IDENTITY, Pose
from rtvideo.core.protocol import parse_message
from rtvideo.core.session_config import resolve_session_config
from rtvideo.core.start_request import check_first_message, validate_start
from tests.support.recorder import Recorder
from tests.support.runtime_standins import SECRET

VELOCITY = {"mode": "velocity", "data": {"translation": [0.0, 0.0, 0.25], "rotation": [0.0, 0.0, 0.0, 1.0]}}
HOME = {"mode": "target", "data": {"translation": [0.0, 0.0, 0.0], "rotation": [0.0, 0.0, 0.0, 1.0]}}


class PoseRecorder:
    """A `Renderer` that keeps what it was asked to render."""

    def __init__(self) -> None:
        self.calls: list[tuple[dict[str, float], int, Sequence[Pose] | None]] = []

    def render(self, mix: Mapping[str, float], num_frames: int, poses: Sequence[Pose] | None = None) -> RenderedChunk:
        self.calls.append((dict(mix), num_frames, poses))
        return RenderedChunk(b"x", num_frames, 0.0, 0.0)

    def close(self) -> bytes:
        return b""


def config() -> Any:
    settings = BackendSettings(width=64, height=64, fps=8, frames_per_chunk=4, default_transition_chunks=2)
    return resolve_session_config(
        validate_start(check_first_message('{"type": "session.start", "prompt": "a lake"}')), settings.capabilities("m")
    )


def admission(event_id: str, event: dict[str, Any], received: float, n: int | None = None) -> Interaction:
    interaction: dict[str, Any] = {"event_id": event_id, "event": event}
    if n is not None:
        interaction["transition_chunks"] = n
    request = parse_message(json.dumps({"type": "session.interaction", "interaction": interaction}))
    assert isinstance(request, InteractionRequest)
    return Interaction.admitted(request, event_id, prompt_default=2, received_at=received)


def test_the_builtin_source_applies_each_kind_its_generator_says_it_takes() -> None:
    """The catalog's kinds (`config.interactions`, what the model refuses beyond) are exactly
    what the built-in source's handlers apply."""
    kinds = catalog.GENERATORS["builtin"].interactions.kinds
    events = {
        "prompt": {"prompt": "snow"},
        "blend": {"prompts": [{"text": "snow", "weight": 1}, {"text": "rain", "weight": 1}]},
        "camera": {"multi_modal_data": {"camera": VELOCITY}},
    }
    assert kinds is not None and set(kinds) == set(events)
    source = GeneratorChunkSource(PoseRecorder(), config(), clock=lambda: 0.0)
    for kind in kinds:
        source.admit_event(admission(kind, events[kind], 0.0))
    with pytest.raises(UnhandledKinds):
        source.admit_event(admission("image", {"multi_modal_data": {"image": {"url": "x"}}}, 0.0))


def test_no_camera_event_no_poses() -> None:
    renderer = PoseRecorder()
    source = GeneratorChunkSource(renderer, config(), clock=lambda: 0.0)
    source.admit_event(admission("p", {"prompt": "snow"}, 0.0))
    source.next_chunk(4)
    assert renderer.calls[0][2] is None  # rendered exactly as without camera control


def test_poses_per_frame_and_merged_lists() -> None:
    now = [0.0]
    renderer = PoseRecorder()
    source = GeneratorChunkSource(renderer, config(), clock=lambda: now[0])
    source.next_chunk(4)  # boundary at 0.0
    # one event with both parts, received half-way through the chunk (frame 2 of the next at 8 fps)
    source.admit_event(admission("both", {"prompt": "snow", "multi_modal_data": {"camera": VELOCITY}}, 0.25))
    now[0] = 0.5
    chunk = source.next_chunk(4)
    poses = renderer.calls[-1][2]
    assert poses is not None and [p.translation[2] for p in poses] == [0.0, 0.0, 0.25, 0.5]
    plan = chunk.plan
    assert plan.started == ("both",) and plan.active == ("both",) and plan.completed == ()
    assert set(plan.progress) == set(plan.active)
    assert renderer.calls[-1][0] == {"a lake": 0.5, "snow": 0.5}  # the prompt part blends as ever
    source.admit_event(admission("home", {"multi_modal_data": {"camera": HOME}}, 0.5, n=0))
    now[0] = 1.0
    chunk = source.next_chunk(4)
    poses = renderer.calls[-1][2]
    assert poses is not None and poses[0] == IDENTITY
    # the prompt part completes; the camera part is replaced by "home", which completes at once
    assert chunk.plan.started == ("home",)
    assert chunk.plan.completed == ("both", "home")


# --- through the session manager ------------------------------------------------------------
class RecordingSource:
    """A source that records the events it is handed, and yields what the test puts."""

    pacing = False

    def __init__(self) -> None:
        self.items: queue.Queue[Any] = queue.Queue()
        self.admitted: list[str] = []
        self.closed = threading.Event()

    def admit_event(self, interaction: Interaction) -> None:
        self.admitted.append(interaction.event_id)

    def next_chunk(self, max_frames: int) -> Any:
        return self.items.get()

    def interrupt(self) -> None:
        self.items.put(None)

    def close(self) -> bytes:
        self.closed.set()
        return b""


class OneSource:
    def __init__(self, source: Any) -> None:
        self.source = source

    def open(self, config: Any, request_id: str) -> Any:
        return self.source

    def close(self) -> None:
        pass


def session_with(source: Any) -> tuple[SessionManager, Recorder]:
    settings = BackendSettings(width=64, height=64, max_sessions=1, default_transition_chunks=2)
    mgr = SessionManager(
        sources=OneSource(source),
        capabilities=settings.capabilities("realtime_video"),
        limits=Limits(pacing_lead_chunks=None, max_session_seconds=60.0, stall_timeout_seconds=60.0),
        max_sessions=1,
        watchdog_interval=0.05,
    )
    ch = Recorder()
    mgr.on_request(1, b'{"type": "session.start", "prompt": "p"}', start=True, end=False, channel=ch, secret=SECRET)
    return mgr, ch


def send(mgr: SessionManager, event_id: str, event: dict[str, Any]) -> Recorder:
    ack = Recorder()
    payload = json.dumps({"type": "session.interaction", "interaction": {"event_id": event_id, "event": event}})
    mgr.on_request(1, payload.encode(), start=False, end=False, channel=ack, secret=SECRET)
    return ack


def test_a_modality_the_generator_does_not_register_is_acked_then_failed_by_name() -> None:
    """The built-in generator's kinds (`config.interactions`): prompt, blend, camera; an image is
    refused before the source sees it, and the session goes on."""
    source = RecordingSource()
    mgr, ch = session_with(source)
    ack = send(mgr, "img", {"multi_modal_data": {"image": {"url": "https://example.com/a.png"}}})
    assert ack.types() == ["session.interaction.queued"]
    assert send(mgr, "p", {"prompt": "snow"}).types() == ["session.interaction.queued"]
    assert source.admitted == ["p"]
    errors = [m for m, _, _ in ch.sent if m and m["type"] == "error"]
    assert [(e["code"], e["event_id"]) for e in errors] == [("interaction_failed", "img")]
    assert errors[0]["message"] == (
        "interaction modality 'image' is not supported by the active model (it registers blend, camera, prompt); "
        "nothing of this event was applied"
    )
    mgr.on_request(1, b'{"type": "session.stop"}', start=False, end=True, channel=Recorder(), secret=SECRET)
    source.items.put(None)
    assert ch.finished.wait(5)
    done = ch.sent[-1][0]
    assert done["unapplied_event_ids"] == ["p"] and "img" not in done["unfinished_event_ids"]


def test_a_held_velocity_is_unfinished_in_session_done() -> None:
    renderer = PoseRecorder()
    source = GeneratorChunkSource(renderer, config())
    mgr, ch = session_with(source)
    assert send(mgr, "v", {"multi_modal_data": {"camera": VELOCITY}}).types() == ["session.interaction.queued"]
    deadline = threading.Event()
    for _ in range(200):  # until a chunk started it
        if any(m and m.get("started_event_ids") == ["v"] for m, _, _ in ch.sent):
            break
        deadline.wait(0.02)
    mgr.on_request(1, b'{"type": "session.stop"}', start=False, end=True, channel=Recorder(), secret=SECRET)
    assert ch.finished.wait(10)
    done = ch.sent[-1][0]
    assert done["type"] == "session.done" and done["unfinished_event_ids"] == ["v"]
    assert any(p is not None and p[-1].translation[2] > 0 for _, _, p in renderer.calls)
    assert np.isfinite([p[-1].translation[2] for _, _, p in renderer.calls if p]).all()
