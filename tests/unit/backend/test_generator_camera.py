"""The built-in generator's camera: measured image motion has the sign and rough size a pose change implies.

Two sessions with the same seed render the same instant from two poses, so the scene's own
animation cancels and only the camera differs; phase correlation between the two frames (on
a band of rows: the sky, or the ground) measures the motion. Unity axes: +X right, +Y up,
+Z forward; yaw > 0 looks right, pitch > 0 looks down (rtvideo/backend/builtin/scene/camera.py,
`view_angles`). The expected sizes come from the camera model's focal length and layer rates.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from rtvideo.backend.builtin.generator import BuiltinGenerator, BuiltinSession
from rtvideo.backend.builtin.scene.camera import YAW_RATE, Layer
from rtvideo.core.pose import IDENTITY, Pose
from tests.support.image_motion import gray, shift

SIZE = 256
#: clouds in the sky, a skyline, and a road (lane lines, dashes) on the ground: texture in every band
PROMPT = "a city street with buildings"
SEED = 4


@pytest.fixture(scope="module")
def generator() -> BuiltinGenerator:
    return BuiltinGenerator(device="cpu", fps=16)


def turn(axis: int, angle: float) -> tuple[float, float, float, float]:
    q = [0.0, 0.0, 0.0, math.cos(angle / 2)]
    q[axis] = math.sin(angle / 2)
    return (q[0], q[1], q[2], q[3])


def session(generator: BuiltinGenerator, seed: int = SEED) -> BuiltinSession:
    return generator.open_session(width=SIZE, height=SIZE, seed=seed)


def frame(generator: BuiltinGenerator, pose: Pose, prompt: str = PROMPT) -> np.ndarray:
    return session(generator).generate({prompt: 1.0}, 1, [pose])[0]


def bands(generator: BuiltinGenerator) -> tuple[slice, slice]:
    """Rows of the sky (above the tallest silhouettes) and of the near ground, for this seed."""
    camera = session(generator)._layout().camera
    horizon = round((camera.hz0 + camera.bh) / (2 * camera.bh) * SIZE)
    return slice(0, max(24, horizon - 70)), slice(horizon + 24, SIZE)


def pixels(units: float, generator: BuiltinGenerator) -> float:
    """Scene units (the long side spans 2) in output pixels."""
    return units * SIZE / 2


def test_identity_poses_render_exactly_the_fixed_camera(generator: BuiltinGenerator) -> None:
    fixed = session(generator).generate({PROMPT: 1.0}, 4)
    assert np.array_equal(session(generator).generate({PROMPT: 1.0}, 4, [IDENTITY] * 4), fixed)
    flipped = Pose(rotation=(0.0, 0.0, 0.0, -1.0))  # the same rotation written as -q
    assert np.array_equal(session(generator).generate({PROMPT: 1.0}, 4, [flipped] * 4), fixed)
    # in a chunk that moves, a frame at the start pose shows the start view (to rounding: the layers
    # are summed in another order)
    tiny = Pose(rotation=turn(1, 1e-9))
    mixed = session(generator).generate({PROMPT: 1.0}, 4, [IDENTITY, tiny, IDENTITY, tiny]).astype(np.int16)
    assert np.abs(mixed - fixed).max() <= 1


def test_a_pose_per_frame_is_required(generator: BuiltinGenerator) -> None:
    with pytest.raises(ValueError, match="one pose per frame"):
        session(generator).generate({PROMPT: 1.0}, 3, [IDENTITY])


def test_yaw_pans_with_parallax(generator: BuiltinGenerator) -> None:
    angle = 0.05
    start, turned = frame(generator, IDENTITY), frame(generator, Pose(rotation=turn(1, angle)))
    sky, ground = bands(generator)
    focal = session(generator)._layout().camera.focal
    _, sky_dx = shift(start[sky], turned[sky])
    _, ground_dx = shift(start[ground], turned[ground])
    expected_sky = pixels(YAW_RATE[Layer.SKY] * focal * angle, generator)
    expected_ground = pixels(YAW_RATE[Layer.GROUND] * focal * angle, generator)
    # looking right moves the content left; the sky lags the ground
    assert -1.5 * expected_sky < sky_dx < -0.5 * expected_sky, (sky_dx, expected_sky)
    assert -1.5 * expected_ground < ground_dx < -0.5 * expected_ground, (ground_dx, expected_ground)
    assert abs(ground_dx) > 1.5 * abs(sky_dx)
    # the other way round moves it right
    _, back_dx = shift(start[ground], frame(generator, Pose(rotation=turn(1, -angle)))[ground])
    assert back_dx > 0.5 * expected_ground


def test_pitch_moves_the_horizon(generator: BuiltinGenerator) -> None:
    angle = 0.06
    start = frame(generator, IDENTITY)
    focal = session(generator)._layout().camera.focal
    expected = pixels(focal * angle, generator)
    down_dy, down_dx = shift(start, frame(generator, Pose(rotation=turn(0, angle))))
    up_dy, _ = shift(start, frame(generator, Pose(rotation=turn(0, -angle))))
    # looking down moves everything up, by the same amount in every layer
    assert -1.5 * expected < down_dy < -0.5 * expected, (down_dy, expected)
    assert 0.5 * expected < up_dy < 1.5 * expected, (up_dy, expected)
    assert abs(down_dx) < 1.5


def test_roll_rotates_the_view(generator: BuiltinGenerator) -> None:
    angle = 0.08
    start, rolled = frame(generator, IDENTITY), frame(generator, Pose(rotation=turn(2, angle)))
    half = SIZE // 2
    left_dy, _ = shift(start[:, : half - 16], rolled[:, : half - 16])
    right_dy, _ = shift(start[:, half + 16 :], rolled[:, half + 16 :])
    # the camera's right side goes up, so the view turns clockwise: its right half moves down, its left half up
    arm = pixels(0.5, generator)  # a half's centre is half a unit from the view's centre
    assert right_dy > 0.4 * arm * angle and left_dy < -0.4 * arm * angle, (left_dy, right_dy)


def block_dy(before: np.ndarray, after: np.ndarray, rows: slice, cols: slice, search: int = 14) -> int:
    """The vertical shift (pixels) of a block between two frames, by the least squared difference:
    forward motion expands the view, which no single shift describes, so this looks at one block."""
    a, b = gray(before), gray(after)
    target = b[rows, cols]
    errors = {
        s: float(np.mean((target - a[rows.start - s : rows.stop - s, cols]) ** 2)) for s in range(-search, search + 1)
    }
    return min(errors, key=errors.__getitem__)


@pytest.mark.parametrize("seed", [4, 5])
def test_forward_streams_the_ground_towards_the_viewer(generator: BuiltinGenerator, seed: int) -> None:
    camera = session(generator, seed)._layout().camera
    horizon = round((camera.hz0 + camera.bh) / (2 * camera.bh) * SIZE)
    start = session(generator, seed).generate({PROMPT: 1.0}, 1, [IDENTITY])[0]
    rows, cols = slice(200, 240), slice(96, 160)  # the road's dashes, near the camera
    # a pinhole over a ground plane 1 unit below: a row d below the horizon shows depth f/d
    d = (220 + 0.5) / (SIZE / 2) - 1 - camera.hz0
    for step in (0.12, -0.12):
        moved = session(generator, seed).generate({PROMPT: 1.0}, 1, [Pose(translation=(0.0, 0.0, step))])[0]
        expected = (d - camera.focal / (camera.focal / d + step)) * SIZE / 2
        measured = block_dy(start, moved, rows, cols)
        # forward, the ground comes down the view, towards the camera (and back, away from it)
        assert (
            math.copysign(1, measured) == math.copysign(1, step)
            and 0.4 * abs(expected) <= abs(measured) <= 1.6 * abs(expected) + 1
        ), (step, measured, expected)
        # far layers barely move: the skyline just above the horizon stays
        assert abs(block_dy(start, moved, slice(horizon - 40, horizon - 4), cols)) <= 1


def test_sideways_moves_near_layers_more_than_far_ones(generator: BuiltinGenerator) -> None:
    step = 0.1
    start, right = frame(generator, IDENTITY), frame(generator, Pose(translation=(step, 0.0, 0.0)))
    sky, ground = bands(generator)
    _, ground_dx = shift(start[ground], right[ground])
    _, sky_dx = shift(start[sky], right[sky])
    assert ground_dx < -2.0, ground_dx  # stepping right moves the near ground left
    assert abs(sky_dx) < 1.0
    _, left_dx = shift(start[ground], frame(generator, Pose(translation=(-step, 0.0, 0.0)))[ground])
    assert left_dx > 2.0, left_dx


def test_motion_is_smooth_within_a_chunk(generator: BuiltinGenerator) -> None:
    """A pose per frame: a steady turn moves the content by the same amount from frame to frame."""
    rate = 0.02
    poses = [Pose(rotation=turn(1, rate * k)) for k in range(6)]
    # each frame against a fixed camera at the same instant, so the scene's own motion cancels
    moving = session(generator).generate({PROMPT: 1.0}, 6, poses)
    fixed = session(generator).generate({PROMPT: 1.0}, 6)
    _, ground = bands(generator)
    offsets = np.array([shift(fixed[k][ground], moving[k][ground])[1] for k in range(6)])
    focal = session(generator)._layout().camera.focal
    per_frame = pixels(YAW_RATE[Layer.GROUND] * focal * rate, generator)
    assert (np.diff(offsets) < 0).all(), offsets
    assert np.abs(offsets + per_frame * np.arange(6)).max() < 3.0, (offsets, per_frame)


def test_returning_to_the_start_pose_shows_the_start_view(generator: BuiltinGenerator) -> None:
    moved = session(generator)
    fixed = session(generator)
    away = [Pose(translation=(0.3 * k, 0.1, 0.4 * k), rotation=turn(1, 0.3 * k)) for k in range(4)]
    moved.generate({PROMPT: 1.0}, 4, away)
    fixed.generate({PROMPT: 1.0}, 4)
    assert np.array_equal(moved.generate({PROMPT: 1.0}, 2, [IDENTITY] * 2), fixed.generate({PROMPT: 1.0}, 2))


def test_a_full_turn_is_seamless(generator: BuiltinGenerator) -> None:
    """Yaw just short of half a turn either way looks the same: a turn never jumps."""
    eps = 1e-3
    a = frame(generator, Pose(rotation=turn(1, math.pi - eps))).astype(np.int16)
    b = frame(generator, Pose(rotation=turn(1, -math.pi + eps))).astype(np.int16)
    assert np.abs(a - b).mean() < 1.0


def test_far_travel_stays_a_scene(generator: BuiltinGenerator) -> None:
    """Flying on forever (the near ground as a treadmill) never collapses the view to a smear."""
    start = frame(generator, IDENTITY)
    far = frame(generator, Pose(translation=(3.0, 0.0, 250.7)))
    _, ground = bands(generator)
    assert gray(far[ground]).std() > 0.3 * gray(start[ground]).std()


def test_prompt_transitions_and_camera_motion_combine(generator: BuiltinGenerator) -> None:
    other = "a snowy forest at night"
    poses = [Pose(rotation=turn(1, 0.03 * k)) for k in range(4)]
    mixed = session(generator).generate({PROMPT: 0.5, other: 0.5}, 4, poses).astype(np.int16)
    still = session(generator).generate({PROMPT: 0.5, other: 0.5}, 4).astype(np.int16)
    alone = session(generator).generate({PROMPT: 1.0}, 4, poses).astype(np.int16)
    assert np.abs(mixed[0] - still[0]).max() == 0  # frame 0 is at the start pose
    assert np.abs(mixed[3] - still[3]).mean() > 2  # the camera moved ...
    assert np.abs(mixed[3] - alone[3]).mean() > 5  # ... through the mixed scene
