"""Camera control (`rtvideo.core.camera`) against vLLM-Omni's own `SE3DeltaCameraHandler`.

The oracle is the handler run from the pinned wheel (tests/support/vllm_omni_wheel.py):
hypothesis drives it and our `CameraTracker` with the same random sequences of camera events
(modes, poses, transition_chunks, receipt times within chunks, chunk sizes and fps) and
compares every frame's pose and each chunk's started/active/completed_event_ids. The event
shape (`prompt` and/or `multi_modal_data`) is checked through `rtvideo.core.protocol`, and the
published client schema is held to the parser on random camera events.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rtvideo.core.camera import (
    ACTIONS_MESSAGE,
    CameraError,
    CameraMode,
    CameraTracker,
    chunk_lists,
    compose,
    frame_offset,
    merge_ids,
    parse_camera,
)
from rtvideo.core.errors import ErrorCode, ProtocolError
from rtvideo.core.interaction.types import CAMERA, InteractionRequest, resolve_chunks
from rtvideo.core.pose import IDENTITY, Pose
from rtvideo.core.protocol import parse_message
from tests.support.streams import schema_errors
from tests.support.vllm_omni_wheel import Sampling, StepRequestState, load_interaction


def camera_module() -> Any:
    return load_interaction()["modality_handlers.camera"]


def types_module() -> Any:
    return load_interaction()["types"]


def matrix(pose: Pose) -> list[list[float]]:
    """Our pose as the handler's 4x4 matrix (so a quaternion's sign does not matter)."""
    real = camera_module().CameraPose(translation=pose.translation, rotation=pose.rotation)
    return real.as_matrix().tolist()


def close(a: list[list[float]], b: list[list[float]], tol: float = 1e-7) -> bool:
    return all(
        math.isclose(x, y, rel_tol=tol, abs_tol=tol)
        for ra, rb in zip(a, b, strict=True)
        for x, y in zip(ra, rb, strict=True)
    )


# --- validation ----------------------------------------------------------------------------
def test_a_payload_is_parsed_and_its_rotation_normalised() -> None:
    cmd = parse_camera({"mode": "velocity", "data": {"translation": [0, 0, 0.05], "rotation": [0, 0, 0, 2]}})
    assert cmd.mode is CameraMode.VELOCITY
    assert cmd.pose == Pose((0.0, 0.0, 0.05), (0.0, 0.0, 0.0, 1.0))
    bare = parse_camera({"data": {}})  # the handler's defaults: target, zero, identity
    assert bare.mode is CameraMode.TARGET and bare.pose == IDENTITY


BAD = [
    ({"mode": "orbit", "data": {}}, "camera mode must be 'target' or 'velocity'"),
    ({"mode": "target"}, "camera data must be an object"),
    ({"data": []}, "camera data must be an object"),
    ({"data": {"actions": ["w"]}}, ACTIONS_MESSAGE),
    ({"data": {"translation": [0, 0]}}, "camera translation must be a length-3 list/tuple"),
    ({"data": {"translation": "abc"}}, "camera translation must be a length-3 list/tuple"),
    ({"data": {"rotation": [0, 0, 1]}}, "camera rotation must be a length-4 list/tuple (x, y, z, w)"),
    ({"data": {"translation": [0, float("nan"), 0]}}, "must be non-nan and non-inf"),
    ({"data": {"rotation": [0, 0, float("inf"), 1]}}, "must be non-nan and non-inf"),
    ({"data": {"rotation": [0, 0, 0, 0]}}, "quaternion must be non-zero"),
    ({"data": {"translation": [0, True, 0]}}, "must hold numbers"),
    ({"data": {"translation": [0, "1", 0]}}, "must hold numbers"),
    ({"data": {"translation": [0, 0, 1e7]}}, "within"),
    ({"data": {"rotaton": [0, 0, 0, 1]}}, "unknown camera data field(s): rotaton"),
    ({"data": {}, "speed": 2}, "unknown camera field(s): speed"),
    ("forward", "must be an object"),
]


@pytest.mark.parametrize("payload,message", BAD)
def test_bad_payloads_are_refused_with_the_handlers_words(payload: Any, message: str) -> None:
    with pytest.raises(CameraError) as info:
        parse_camera(payload)
    assert message in str(info.value)


def test_what_the_handler_refuses_we_refuse() -> None:
    handler = camera_module().SE3DeltaCameraHandler()
    state = StepRequestState("r", Sampling())
    for payload, _ in BAD[:10]:
        if not isinstance(payload, dict):
            continue
        with pytest.raises(ValueError):
            handler.validate_payload(state, event_id="e", payload=payload, transition_chunks=None)


def test_frame_offset_and_merge_are_the_wheels() -> None:
    real = types_module().resolve_event_frame_offset
    for received, previous, n, fps in [(1.0, None, 8, 16), (1.26, 1.0, 8, 16), (3.0, 1.0, 8, 16), (0.5, 1.0, 8, 16)]:
        assert frame_offset(received, previous, n, fps) == real(
            received_at=received, previous_boundary_at=previous, num_frames=n, fps=fps
        )
    assert merge_ids(["a", "b"], ["b", "c", "a"]) == ("a", "b", "c")


def test_compose_is_the_handlers() -> None:
    cam = camera_module()
    base = Pose((1.0, 2.0, 3.0), (0.0, math.sin(0.3), 0.0, math.cos(0.3)))
    delta = Pose((0.0, 0.0, 0.5), (math.sin(0.1), 0.0, 0.0, math.cos(0.1)))
    real = cam._compose_pose(
        cam.CameraPose(base.translation, base.rotation), cam.CameraPose(delta.translation, delta.rotation)
    )
    assert close(matrix(compose(base, delta)), real.as_matrix().tolist(), 1e-12)


# --- the oracle ------------------------------------------------------------------------------
unit = st.floats(-1.0, 1.0, allow_nan=False)
quaternions = st.tuples(unit, unit, unit, unit).filter(lambda q: sum(v * v for v in q) > 1e-3)
translations = st.tuples(*(st.floats(-2.0, 2.0, allow_nan=False),) * 3)
payloads = st.builds(
    lambda mode, t, q: {"mode": mode, "data": {"translation": list(t), "rotation": list(q)}},
    st.sampled_from(["target", "velocity"]),
    translations,
    quaternions,
)
events = st.tuples(payloads, st.one_of(st.none(), st.integers(0, 3)), st.floats(0.0, 1.5))
chunks = st.lists(st.tuples(st.integers(1, 12), st.lists(events, max_size=3)), min_size=1, max_size=8)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chunks=chunks, fps=st.sampled_from([8.0, 16.0, 24.0, 30.0]))
def test_the_tracker_is_the_handler(chunks: list[tuple[int, list[Any]]], fps: float) -> None:
    """Same events (receipt times around the chunk before each boundary), same chunk sizes:
    same pose on every frame, same three lists on every chunk.

    One case has no single answer: a `target` whose rotation is opposite the pose it starts
    from (quaternion dot product ~0, a half turn apart) has two shortest paths, and which one
    nlerp takes turns on the sign of a dot product that is zero up to rounding (torch's matrix
    product and ours round differently). From such a frame on the poses are not compared;
    the lists, which depend on timing only, always are."""
    cam = camera_module()
    handler = cam.SE3DeltaCameraHandler()
    state = StepRequestState("r", Sampling())
    ours = CameraTracker()
    boundary, previous, serial = 0.0, None, 0
    running: tuple[str, ...] = ()  # the handler's active event at the previous chunk's end
    began: set[str] = set()
    ended: set[str] = set()
    poses_comparable = True
    for frames, batch in chunks:
        chunk_seconds = frames / fps
        targets: dict[int, list[Pose]] = {}  # frame of this chunk -> targets that start there
        for payload, n, where in batch:
            serial += 1
            event_id = f"e{serial}"
            received = boundary - chunk_seconds + where * chunk_seconds
            handler.enqueue(state, event_id=event_id, received_at=received, payload=payload, transition_chunks=n)
            command = parse_camera(payload)
            ours.admit(event_id, command, resolve_chunks(CAMERA, n, 0), received)
            if command.mode is CameraMode.TARGET:
                targets.setdefault(frame_offset(received, previous, frames, fps), []).append(command.pose)
        before = ours.pose
        meta = handler.apply_at_chunk_boundary(
            state, boundary_at=boundary, num_media_frames=frames, fps=fps, num_latent_frames=frames
        )
        mine = ours.next_chunk(frames, fps, boundary)
        # the handler's lists, with active as the protocol defines it (every contributing event)
        expected = chunk_lists(running, meta.started_event_ids, meta.completed_event_ids, meta.active_event_ids)
        assert (mine.started, mine.active, mine.completed) == expected
        assert set(mine.started) <= set(mine.active) and set(mine.completed) <= set(mine.active)
        # an event is active from its start to its completion inclusive, and never after
        assert not set(mine.active) & ended and not set(mine.started) & began
        assert set(running) <= set(mine.active)
        began |= set(mine.started)
        ended |= set(mine.completed)
        running = tuple(meta.active_event_ids)
        real_poses = state.interaction_sessions["camera"].last_absolute_poses.tolist()
        assert len(mine.poses) == len(real_poses) == frames
        for index, (pose, real) in enumerate(zip(mine.poses, real_poses, strict=True)):
            source = before if index == 0 else mine.poses[index - 1]
            if any(
                abs(sum(a * b for a, b in zip(source.rotation, t.rotation, strict=True))) < 1e-6
                for t in targets.get(index, ())
            ):
                poses_comparable = False  # a half turn: either path is the handler's, up to rounding
            if poses_comparable:
                assert close(matrix(pose), real), (index, pose, real)
        assert set(mine.progress) == set(mine.active)
        boundary, previous = boundary + chunk_seconds, boundary


def test_target_reaches_its_pose_on_the_last_frame_and_back_to_start() -> None:
    t = CameraTracker()
    t.admit("go", parse_camera({"mode": "target", "data": {"translation": [0, 0, 1]}}), 2, 0.0)
    first = t.next_chunk(4, 16.0, 0.0)
    assert first.started == ("go",) and first.active == ("go",) and first.completed == ()
    assert [p.translation[2] for p in first.poses] == [0.125, 0.25, 0.375, 0.5]
    second = t.next_chunk(4, 16.0, 0.25)
    assert second.completed == ("go",) and second.active == ("go",)  # it contributes to the chunk it completes in
    assert second.poses[-1].translation == (0.0, 0.0, 1.0) and second.progress == {"go": 1.0}
    t.admit("home", parse_camera({"mode": "target", "data": {}}), 0, 0.3)
    back = t.next_chunk(4, 16.0, 0.5)
    assert back.poses[0] == IDENTITY  # N = 0: the target on the event's own frame
    assert back.started == back.completed == back.active == ("home",)
    assert t.next_chunk(4, 16.0, 0.75).active == ()  # never listed after its completion


def test_a_velocity_is_held_until_replaced_and_the_replaced_one_completes() -> None:
    t = CameraTracker()
    t.admit("v", parse_camera({"mode": "velocity", "data": {"translation": [0.1, 0, 0]}}), 1, 0.0)
    a = t.next_chunk(3, 10.0, 0.0)
    assert [round(p.translation[0], 9) for p in a.poses] == [0.1, 0.2, 0.3] and a.active == ("v",)
    b = t.next_chunk(3, 10.0, 0.3)
    assert round(b.poses[-1].translation[0], 9) == 0.6 and b.started == () and b.active == ("v",)
    t.admit("stop", parse_camera({"mode": "velocity", "data": {}}), 1, 0.3 + 0.15)  # frame 1 of the next
    c = t.next_chunk(3, 10.0, 0.6)
    assert c.started == ("stop",) and c.completed == ("v",) and c.active == ("v", "stop")
    assert c.progress == {"v": 1.0, "stop": 1.0}
    assert [round(p.translation[0], 9) for p in c.poses] == [0.7, 0.7, 0.7]


# --- the event shape (rtvideo.core.protocol) ---------------------------------------------------
def interaction(event: Any, **extra: Any) -> str:
    return json.dumps({"type": "session.interaction", "interaction": {"event_id": "c1", "event": event, **extra}})


VELOCITY = {"mode": "velocity", "data": {"translation": [0.0, 0.0, 0.05], "rotation": [0.0, 0.0, 0.0, 1.0]}}


def test_camera_only_and_composite_events_are_accepted() -> None:
    only = parse_message(interaction({"multi_modal_data": {"camera": VELOCITY}}))
    assert isinstance(only, InteractionRequest) and only.event == {"multi_modal_data": {"camera": VELOCITY}}
    both = parse_message(interaction({"prompt": "fog", "multi_modal_data": {"camera": VELOCITY}}, transition_chunks=2))
    assert isinstance(both, InteractionRequest) and both.event["prompt"] == "fog" and both.transition_chunks == 2
    nulls = parse_message(interaction({"prompt": None, "multi_modal_data": {"camera": VELOCITY}}))
    assert isinstance(nulls, InteractionRequest) and nulls.event == {"multi_modal_data": {"camera": VELOCITY}}
    prompt_null_mm = parse_message(interaction({"prompt": "rain", "multi_modal_data": None}))
    assert isinstance(prompt_null_mm, InteractionRequest) and prompt_null_mm.event == {"prompt": "rain"}
    other = parse_message(interaction({"multi_modal_data": {"image": {"url": "x"}}}))  # acked, then failed
    assert isinstance(other, InteractionRequest)


@pytest.mark.parametrize(
    "event,fragment",
    [
        ({}, "prompt and/or multi_modal_data"),
        ({"multi_modal_data": {}}, "non-empty object"),
        ({"multi_modal_data": []}, "must be an object"),
        ({"multi_modal_data": {"camera": 3}}, "must be an object"),
        ({"multi_modal_data": {"camera": {"data": {"actions": ["w"]}}}}, ACTIONS_MESSAGE),
        ({"multi_modal_data": {"camera": {"mode": "spin", "data": {}}}}, "camera mode must be"),
        ({"prompt": "", "multi_modal_data": {"camera": VELOCITY}}, "must not be empty"),
        ({"prompt": None}, "must be a string"),
    ],
)
def test_bad_events_are_invalid_interaction(event: Any, fragment: str) -> None:
    with pytest.raises(ProtocolError) as info:
        parse_message(interaction(event))
    assert info.value.code is ErrorCode.INVALID_INTERACTION and fragment in info.value.message
    assert info.value.event_id == "c1"


def test_the_fingerprint_covers_the_camera_part() -> None:
    a = parse_message(interaction({"multi_modal_data": {"camera": VELOCITY}}))
    b = parse_message(interaction({"multi_modal_data": {"camera": {**VELOCITY, "mode": "target"}}}))
    assert isinstance(a, InteractionRequest) and isinstance(b, InteractionRequest)
    assert a.fingerprint != b.fingerprint
    again = parse_message(interaction({"multi_modal_data": {"camera": VELOCITY}}))
    assert isinstance(again, InteractionRequest) and again.fingerprint == a.fingerprint


numbers = st.one_of(st.floats(-2.0, 2.0, allow_nan=False), st.integers(-3, 3), st.just(0), st.booleans(), st.just("1"))
camera_payloads = st.fixed_dictionaries(
    {},
    optional={
        "mode": st.sampled_from(["target", "velocity", "orbit", None]),
        "data": st.one_of(
            st.just(None),
            st.fixed_dictionaries(
                {},
                optional={
                    "translation": st.lists(numbers, max_size=4),
                    "rotation": st.lists(numbers, max_size=5),
                    "actions": st.just(["w"]),
                    "speed": st.just(1),
                },
            ),
        ),
        "extra": st.just(1),
    },
)
mm_events = st.fixed_dictionaries(
    {},
    optional={
        "prompt": st.sampled_from(["p", "", None, 3]),
        "multi_modal_data": st.one_of(
            st.just(None),
            st.just([]),
            st.dictionaries(st.sampled_from(["camera", "image"]), st.one_of(camera_payloads, st.just(2)), max_size=2),
        ),
    },
)


@settings(max_examples=400, deadline=None)
@given(event=mm_events)
def test_schema_and_parser_agree_on_events(event: dict[str, Any]) -> None:
    message = {"type": "session.interaction", "interaction": {"event": event}}
    try:
        parse_message(json.dumps(message))
        accepted = True
    except ProtocolError:
        accepted = False
    assert (not schema_errors(message, "client_messages")) == accepted, message
