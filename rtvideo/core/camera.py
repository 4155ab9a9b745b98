"""Camera control: `multi_modal_data.camera` validated, and one session's camera timeline.

The semantics are vLLM-Omni 0.30's `SE3DeltaCameraHandler`
(`vllm_omni/diffusion/interaction/modality_handlers/camera.py`), frame for frame
(tests/unit/core/test_camera.py drives the real handler from the pinned wheel as an oracle):

- a payload is `{"mode": "target"|"velocity", "data": {"translation": [x, y, z],
  "rotation": [x, y, z, w]}}` in Unity axes (+X right, +Y up, +Z forward); `mode` defaults to
  `target`, `translation` to zero, `rotation` to the identity; the quaternion is normalised on
  receipt; `data.actions` (key tokens) is refused with the handler's own message;
- `target`: from the pose at the event's effective frame to the absolute pose (relative to
  the session's start) over `transition_chunks` (default 1) × the chunk's frames, translation
  lerped and rotation nlerped per frame; the event completes on the frame that reaches it;
- `velocity`: the pose is composed with the event's SE(3) delta once per frame
  (T ← T · Δ) until another camera event replaces it;
- a camera event replaces the active one, which is then reported completed;
- the chunk lists follow the protocol, not the handler: every event contributing to a chunk
  is in `active` (`chunk_lists`), where the handler lists only the one running at its end;
- an event takes effect at the frame of its receipt time within the chunk
  (`resolve_event_frame_offset`: ⌊(received − previous boundary) · fps⌋, clamped to the chunk).

Beyond the handler, stricter on input: unknown keys in the payload or its `data`, non-numbers
and components beyond `MAX_CAMERA_TRANSLATION` are refused (the handler would silently default
a misspelt key to the identity).

Pure: no I/O, no clocks (callers pass receipt and boundary times), no threads.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rtvideo.core.pose import IDENTITY, Pose

MODALITY = "camera"
#: vLLM-Omni's `SE3DeltaCameraHandler.default_transition_chunks`
DEFAULT_TRANSITION_CHUNKS = 1
#: largest |component| of a camera translation (scene units; a target or a per-frame delta)
MAX_CAMERA_TRANSLATION = 1e6

Vec3 = tuple[float, float, float]
Quat = tuple[float, float, float, float]


class CameraMode(enum.Enum):
    TARGET = "target"
    VELOCITY = "velocity"


class CameraError(ValueError):
    """A camera payload vLLM-Omni (or our stricter rules) would refuse; the message says why."""


#: vLLM-Omni's message for key tokens (`SE3DeltaCameraHandler.validate_payload`)
ACTIONS_MESSAGE = (
    "camera data.actions (WASD keys) is not accepted by the engine; send structural translation/rotation instead"
)


@dataclass(frozen=True)
class CameraCommand:
    """A validated camera payload: the absolute pose (`target`) or the per-frame delta (`velocity`)."""

    mode: CameraMode
    pose: Pose


def parse_camera(payload: Any) -> CameraCommand:
    """Validate `multi_modal_data.camera`; raises `CameraError`."""
    if not isinstance(payload, Mapping):
        raise CameraError("multi_modal_data.camera must be an object")
    unknown = sorted(set(payload) - {"mode", "data"})
    if unknown:
        raise CameraError(f"unknown camera field(s): {', '.join(map(str, unknown))}")
    mode = payload.get("mode", "target")
    if mode not in ("target", "velocity"):
        raise CameraError("camera mode must be 'target' or 'velocity'")
    data = payload.get("data")
    if not isinstance(data, Mapping):
        raise CameraError("camera data must be an object")
    if "actions" in data:
        raise CameraError(ACTIONS_MESSAGE)
    unknown = sorted(set(data) - {"translation", "rotation"})
    if unknown:
        raise CameraError(f"unknown camera data field(s): {', '.join(map(str, unknown))}")
    translation = _numbers(data.get("translation", (0.0, 0.0, 0.0)), "translation", 3, "a length-3 list/tuple")
    if any(abs(v) > MAX_CAMERA_TRANSLATION for v in translation):
        raise CameraError(f"camera translation components must be within ±{MAX_CAMERA_TRANSLATION:g}")
    rotation = _numbers(data.get("rotation", IDENTITY.rotation), "rotation", 4, "a length-4 list/tuple (x, y, z, w)")
    return CameraCommand(
        CameraMode(mode),
        Pose((translation[0], translation[1], translation[2]), _normalize(rotation)),
    )


def _numbers(value: Any, name: str, length: int, shape: str) -> tuple[float, ...]:
    if not isinstance(value, Sequence) or isinstance(value, (str, bytes)) or len(value) != length:
        raise CameraError(f"camera {name} must be {shape}")
    if any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in value):
        raise CameraError(f"camera {name} must hold numbers")
    if any(math.isnan(v) or math.isinf(v) for v in value):
        raise CameraError(f"camera {name} must be non-nan and non-inf")
    return tuple(float(v) for v in value)


# --- SE(3) arithmetic, as the handler does it (4x4 matrices, quaternion ↔ rotation matrix) -----
def _normalize(q: Sequence[float]) -> Quat:
    x, y, z, w = q
    norm = math.sqrt(x * x + y * y + z * z + w * w)
    if norm <= 0.0 or not math.isfinite(norm):
        raise CameraError("camera rotation quaternion must be non-zero")
    return (x / norm, y / norm, z / norm, w / norm)


def _rotmat(q: Quat) -> list[list[float]]:
    x, y, z, w = q
    xx, yy, zz = x * x, y * y, z * z
    xy, xz, yz = x * y, x * z, y * z
    wx, wy, wz = w * x, w * y, w * z
    return [
        [1.0 - 2.0 * (yy + zz), 2.0 * (xy - wz), 2.0 * (xz + wy)],
        [2.0 * (xy + wz), 1.0 - 2.0 * (xx + zz), 2.0 * (yz - wx)],
        [2.0 * (xz - wy), 2.0 * (yz + wx), 1.0 - 2.0 * (xx + yy)],
    ]


def _quat_of(m: list[list[float]]) -> Quat:
    trace = m[0][0] + m[1][1] + m[2][2]
    if trace > 0.0:
        s = math.sqrt(trace + 1.0) * 2.0
        q = ((m[2][1] - m[1][2]) / s, (m[0][2] - m[2][0]) / s, (m[1][0] - m[0][1]) / s, 0.25 * s)
    elif m[0][0] > m[1][1] and m[0][0] > m[2][2]:
        s = math.sqrt(1.0 + m[0][0] - m[1][1] - m[2][2]) * 2.0
        q = (0.25 * s, (m[0][1] + m[1][0]) / s, (m[0][2] + m[2][0]) / s, (m[2][1] - m[1][2]) / s)
    elif m[1][1] > m[2][2]:
        s = math.sqrt(1.0 + m[1][1] - m[0][0] - m[2][2]) * 2.0
        q = ((m[0][1] + m[1][0]) / s, 0.25 * s, (m[1][2] + m[2][1]) / s, (m[0][2] - m[2][0]) / s)
    else:
        s = math.sqrt(1.0 + m[2][2] - m[0][0] - m[1][1]) * 2.0
        q = ((m[0][2] + m[2][0]) / s, (m[1][2] + m[2][1]) / s, 0.25 * s, (m[1][0] - m[0][1]) / s)
    return _normalize(q)


def compose(base: Pose, delta: Pose) -> Pose:
    """`base` then `delta` in the session frame: T = T_base · T_delta."""
    rb, rd = _rotmat(base.rotation), _rotmat(delta.rotation)
    rot = [[sum(rb[i][k] * rd[k][j] for k in range(3)) for j in range(3)] for i in range(3)]
    t = tuple(sum(rb[i][k] * delta.translation[k] for k in range(3)) + base.translation[i] for i in range(3))
    return Pose((t[0], t[1], t[2]), _quat_of(rot))


def lerp(source: Pose, target: Pose, alpha: float) -> Pose:
    """Translation lerp and quaternion nlerp (shortest path), alpha clamped to [0, 1]."""
    alpha = min(1.0, max(0.0, alpha))
    t = tuple(s + (e - s) * alpha for s, e in zip(source.translation, target.translation, strict=True))
    a, b = source.rotation, target.rotation
    if sum(p * q for p, q in zip(a, b, strict=True)) < 0.0:
        b = (-b[0], -b[1], -b[2], -b[3])
    q = _normalize([p + (e - p) * alpha for p, e in zip(a, b, strict=True)])
    return Pose((t[0], t[1], t[2]), q)


def frame_offset(received_at: float, previous_boundary_at: float | None, num_frames: int, fps: float) -> int:
    """vLLM-Omni's `resolve_event_frame_offset`: where in this chunk an event takes effect."""
    num_frames = max(int(num_frames), 1)
    if previous_boundary_at is None or fps <= 0:
        return 0
    offset = math.floor((received_at - previous_boundary_at) * float(fps))
    return 0 if offset < 0 else min(int(offset), num_frames - 1)


def merge_ids(*lists: Iterable[str]) -> tuple[str, ...]:
    """vLLM-Omni's `merge_interaction_metadata` for one list: in order, each id once."""
    seen: dict[str, None] = {}
    for ids in lists:
        for event_id in ids:
            seen.setdefault(event_id, None)
    return tuple(seen)


def chunk_lists(
    at_start: Iterable[str], started: Iterable[str], completed: Iterable[str], at_end: Iterable[str]
) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """A chunk's camera lists as the protocol defines them, from the handler's view.

    vLLM-Omni 0.30's `SE3DeltaCameraHandler` lists as active only the event still running at
    the chunk's end (`at_end`). The protocol's active list is every event contributing to the
    chunk: the one running at its start (`at_start`), each one started in it, and so each one
    completed in it. So `started ⊆ active` and `completed ⊆ active`, and an event is active
    from its start chunk to its completion chunk inclusive, never after (it is not running at
    the start of the next chunk). The poses are the handler's, unchanged."""
    started_ids, completed_ids = merge_ids(started), merge_ids(completed)
    return started_ids, merge_ids(at_start, started_ids, completed_ids, at_end), completed_ids


# --- one session's camera timeline ---------------------------------------------------------
@dataclass
class _Event:
    event_id: str
    command: CameraCommand
    chunks: int  # target duration in chunks (0 for velocity)
    received_at: float
    elapsed_frames: int = 0
    source: Pose | None = None  # where a target started from
    frame: int | None = None  # forced frame offset (a rebuild replays the recorded one)


@dataclass(frozen=True)
class CameraChunk:
    """One chunk's camera: a pose per frame, and the handler's three event lists."""

    poses: tuple[Pose, ...]
    started: tuple[str, ...] = ()
    active: tuple[str, ...] = ()
    completed: tuple[str, ...] = ()
    progress: dict[str, float] = field(default_factory=dict)
    #: the frame at which each event started in this chunk took effect, when not frame 0
    frame_offsets: dict[str, int] = field(default_factory=dict)


@dataclass
class CameraTracker:
    """Admits camera commands and resolves each chunk into per-frame poses (module docstring)."""

    pose: Pose = IDENTITY
    _pending: list[_Event] = field(default_factory=list)
    _active: _Event | None = None
    _last_boundary_at: float | None = None

    def admit(
        self, event_id: str, command: CameraCommand, chunks: int, received_at: float, frame: int | None = None
    ) -> None:
        """Queue a command for the next boundary. `chunks` is its N, resolved
        (`rtvideo.core.interaction.types.resolve_chunks`: the camera's default is
        `DEFAULT_TRANSITION_CHUNKS`); a velocity ignores it. `frame`: the frame of the next chunk
        at which it takes effect (clamped to the chunk), instead of the one its receipt time gives
        (a rebuild replays a recorded `event_frame_offsets`)."""
        if chunks < 0:
            raise ValueError("transition_chunks must be >= 0")
        if command.mode is CameraMode.VELOCITY:
            chunks = 0
        self._pending.append(_Event(event_id, command, chunks, received_at, frame=frame))

    def next_chunk(self, num_frames: int, fps: float, boundary_at: float | None) -> CameraChunk:
        """The poses of the chunk whose boundary is at `boundary_at` (one per frame), and its
        lists as the protocol defines them (`chunk_lists`). `boundary_at` None: unknown (a
        rebuild's chunks), so the next chunk's events take effect at frame 0, as at a stream's start."""
        num_frames = max(int(num_frames), 1)
        by_frame: dict[int, list[_Event]] = {}
        for event in self._pending:
            if event.frame is not None:
                frame = min(max(int(event.frame), 0), num_frames - 1)
            else:
                frame = frame_offset(event.received_at, self._last_boundary_at, num_frames, fps)
            by_frame.setdefault(frame, []).append(event)
        self._pending = []
        for events in by_frame.values():
            events.sort(key=lambda e: e.received_at)
        at_start = () if self._active is None else (self._active.event_id,)
        started: list[str] = []
        completed: list[str] = []
        ended_progress: dict[str, float] = {}  # an event's progress when it ended in this chunk
        poses: list[Pose] = []
        offsets: dict[str, int] = {}
        for index in range(num_frames):
            for event in by_frame.get(index, ()):
                started.append(event.event_id)
                if index > 0:
                    offsets[event.event_id] = index
                if self._active is not None and self._active.event_id != event.event_id:
                    ended_progress[self._active.event_id] = self._alpha(self._active, num_frames)
                replaced = self._activate(event)
                if replaced is not None and replaced not in completed:
                    completed.append(replaced)
            done = self._step(num_frames)
            poses.append(self.pose)
            if done is not None and done not in completed:
                completed.append(done)
                ended_progress[done] = 1.0
        self._last_boundary_at = boundary_at
        at_end = () if self._active is None else (self._active.event_id,)
        progress = {**ended_progress, **self._progress(num_frames)}
        started_ids, active, completed_ids = chunk_lists(at_start, started, completed, at_end)
        return CameraChunk(
            tuple(poses),
            started_ids,
            active,
            completed_ids,
            {event_id: progress[event_id] for event_id in active},
            {event_id: frame for event_id, frame in offsets.items() if event_id in started_ids},
        )

    def _progress(self, num_frames: int) -> dict[str, float]:
        return {} if self._active is None else {self._active.event_id: self._alpha(self._active, num_frames)}

    @staticmethod
    def _alpha(event: _Event, num_frames: int) -> float:
        if event.command.mode is CameraMode.VELOCITY:
            return 1.0  # a held velocity: fully applied, until replaced
        total = max(1, round(event.chunks * float(num_frames)))
        return min(1.0, event.elapsed_frames / total)

    def _activate(self, event: _Event) -> str | None:
        replaced = None
        if self._active is not None and self._active.event_id != event.event_id:
            replaced = self._active.event_id
        event.elapsed_frames = 0
        self._active = event
        event.source = self.pose if event.command.mode is CameraMode.TARGET else None
        return replaced

    def _step(self, frames_this_chunk: int) -> str | None:
        event = self._active
        if event is None:
            return None
        if event.command.mode is CameraMode.VELOCITY:
            self.pose = compose(self.pose, event.command.pose)
            return None
        if event.chunks <= 0:
            return self._reach(event)
        total = max(1, round(event.chunks * float(frames_this_chunk)))
        event.elapsed_frames += 1
        source = event.source or self.pose
        self.pose = lerp(source, event.command.pose, min(1.0, event.elapsed_frames / float(total)))
        if event.elapsed_frames >= total:
            return self._reach(event)
        return None

    def _reach(self, event: _Event) -> str:
        self.pose = event.command.pose
        self._active = None
        return event.event_id
