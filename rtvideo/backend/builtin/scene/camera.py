"""The camera: depth layers, each resampled as a camera at a pose sees it."""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from rtvideo.core.pose import Pose


class Layer(enum.Enum):
    """How far away a feature is, which sets how it moves with the camera (`CameraModel`)."""

    SKY = "sky"  # at infinity: turns with the camera, never moves with translation
    FAR = "far"  # the mountain range
    MID = "mid"  # trees, the skyline, the lighthouse
    NEAR = "near"  # the subject, the fire, lanterns: close to the camera
    GROUND = "ground"  # the ground plane: each row at its own depth
    SCREEN = "screen"  # optics and weather at the lens (vignette, falling snow, rain): fixed to the view


FEATURE_LAYER: dict[str, Layer] = {
    **{n: Layer.SKY for n in ("sky_top", "sky_hor", "haze")},
    **{n: Layer.SKY for n in ("sun_hi_glow", "sun_hi_disk", "sun_lo_glow", "sun_lo_disk", "moon_glow", "moon_disk")},
    "vignette": Layer.SCREEN,
    **{n: Layer.GROUND for n in ("gnd_far", "gnd_near", "gnd_tex", "dunes", "planks", "road")},
    **{n: Layer.GROUND for n in ("reflect_lo", "reflect_hi")},
    **{n: Layer.FAR for n in ("mountains", "caps", "mountains_lo_glow", "mountains_lo_disk")},
    **{n: Layer.MID for n in ("trees", "buildings", "windows_a", "windows_b", "trees_buildings")},
    **{n: Layer.MID for n in ("trees_mountains", "buildings_mountains", "trees_lo_glow", "trees_lo_disk")},
    **{n: Layer.MID for n in ("buildings_lo_glow", "buildings_lo_disk", "tower", "tower_stripes", "tower_shade")},
    "lamp": Layer.MID,
    **{n: Layer.NEAR for n in ("lanterns", "vehicle", "vehicle_glass", "wheels", "creature", "ears")},
    **{n: Layer.NEAR for n in ("subject_top", "subject_shadow")},
}
DYNAMIC_LAYER: dict[str, Layer] = {
    "clouds": Layer.SKY,
    "glint_lo": Layer.GROUND,
    "glint_hi": Layer.GROUND,
    "flames": Layer.NEAR,
    "flame_core": Layer.NEAR,
    "snowfall": Layer.SCREEN,
    "rain": Layer.SCREEN,
}
#: how fast each layer pans with yaw, relative to the mountains: the sky lags and the ground
#: leads (a stylised parallax). Multiples of 1/2, so that a full turn shows the start view again
#: (`CameraModel`: one frame width is a quarter turn at rate 1, and the view repeats every two widths).
YAW_RATE = {Layer.SKY: 0.5, Layer.FAR: 1.0, Layer.MID: 1.0, Layer.NEAR: 1.5, Layer.GROUND: 1.5}
#: distance of the standing layers, in scene units (the camera is 1 unit above the ground)
LAYER_DEPTH = {Layer.FAR: 40.0, Layer.MID: 10.0, Layer.NEAR: 2.5}
#: forward motion is shown as a treadmill for the near layers: the near scene repeats every this
#: many units, dissolving from one repetition into the next, so a camera may fly on forever
FORWARD_PERIOD = 1.5
#: far layers approach by a bounded amount (they never reach the camera)
FAR_APPROACH = 6.0
#: the camera's height may go from this fraction of its start height ...
MIN_HEIGHT, MAX_HEIGHT = 0.25, 4.0  # ... to this multiple


def is_start_pose(pose: Pose) -> bool:
    """The start pose: no translation, and the identity rotation (q or -q, any scale)."""
    x, y, z, w = pose.rotation
    return not any(pose.translation) and x == y == z == 0 and w != 0


def view_angles(pose: Pose) -> tuple[float, float, float, np.ndarray]:
    """(yaw, pitch, roll, translation in the camera's own axes) of a pose, Unity axes.

    Yaw > 0 looks right, pitch > 0 looks down, roll > 0 turns the camera's right side up
    (the view turns clockwise); the translation is expressed along the camera's current
    right, up and forward axes, so "forward" always moves the way the camera looks."""
    x, y, z, w = pose.rotation
    norm = math.sqrt(x * x + y * y + z * z + w * w) or 1.0
    x, y, z, w = x / norm, y / norm, z / norm, w / norm
    rot = np.array(
        [
            [1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
            [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
            [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)],
        ]
    )
    forward, up, right = rot[:, 2], rot[:, 1], rot[:, 0]
    yaw = math.atan2(forward[0], forward[2])
    pitch = math.asin(max(-1.0, min(1.0, -forward[1])))
    roll = math.atan2(right[1], up[1])
    return yaw, pitch, roll, rot.T @ np.asarray(pose.translation, dtype=np.float64)


def _fold(v: torch.Tensor, half: float) -> torch.Tensor:
    """Coordinates folded into [-half, half] by mirroring at the edges: the scene continues,
    mirrored, beyond the rendered view (a triangle wave of period 4 * half)."""
    u = (v + half) / (4 * half)
    return half - 2 * half * torch.abs(2 * (u - torch.floor(u)) - 1)


@dataclass(frozen=True)
class CameraModel:
    """Where each output pixel of each layer samples the start view, for a camera at a pose.

    A 2.5D camera over the start view's layers: roll turns the view about its centre, pitch
    shifts it vertically and yaw horizontally (per layer, `YAW_RATE`), in proportion to the
    angles (focal length `f`, a quarter turn per frame width at rate 1). Translation moves
    each standing layer by focal length over its depth (`LAYER_DEPTH`), about the horizon;
    the ground plane is reprojected row by row (each row's depth from its distance below the
    horizon, camera height 1), so its texture streams towards the camera going forward and
    slides with parallax going sideways. Every layer's horizon follows the ground's, so the
    layers never part at the horizon. The identity pose gives identity grids."""

    bw: float
    bh: float
    hz0: float
    tilt: float
    xs: np.ndarray  # [w] pixel centres, scene units
    ys: np.ndarray  # [h]

    @property
    def focal(self) -> float:
        return 4 * self.bw / math.pi

    def grids(self, poses: Sequence[Pose]) -> dict[Layer, list[tuple[torch.Tensor, torch.Tensor | None]]]:
        """Per layer, [(grid [T, h, w, 2] for `grid_sample`, weight [T] or None)]: the layer is the
        weighted sum of its samplings (two for the forward treadmill's dissolve). On the CPU, in
        float32 (a few milliseconds a chunk)."""
        views = [view_angles(p) for p in poses]

        def column(values: list[float]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.float32).view(-1, 1, 1)

        yaw, pitch, roll = (column([float(v[i]) for v in views]) for i in range(3))
        tx, ty, tz = (column([float(v[3][i]) for v in views]) for i in range(3))
        f, bw, bh, tilt = self.focal, self.bw, self.bh, self.tilt
        X = torch.as_tensor(self.xs, dtype=torch.float32).view(1, 1, -1)
        Y = torch.as_tensor(self.ys, dtype=torch.float32).view(1, -1, 1)
        # roll, then pitch: the view's pixels in the unrotated frame (y grows downwards). Without
        # roll, columns and rows stay separate ([T, 1, w] and [T, h, 1]) until a layer needs both.
        if bool(roll.any()):
            cos, sin = torch.cos(roll), torch.sin(roll)
            xr, yr = cos * X + sin * Y, -sin * X + cos * Y + f * pitch
        else:
            xr, yr = X.expand(len(views), 1, -1), Y + f * pitch
        height = torch.clamp(1 + ty, MIN_HEIGHT, MAX_HEIGHT)
        x_ground0 = _fold(xr + YAW_RATE[Layer.GROUND] * f * yaw, bw)  # the ground's column, unmoved
        horizon = self.hz0 + tilt * x_ground0

        def grid(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            """Normalised coordinates; heights are folded by `grid_sample`'s reflection padding."""
            return torch.stack(torch.broadcast_tensors(x / bw, y / bh), dim=-1)

        def aligned(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            """Sample a layer at column x (folded) and height y relative to the ground's horizon."""
            x = _fold(x, bw)
            return grid(x, y + tilt * (x - x_ground0))

        phase = torch.remainder(tz, FORWARD_PERIOD)
        dissolve = (phase / FORWARD_PERIOD).view(-1)
        # (forward offset, weight) pairs: the treadmill's dissolve between two repetitions
        steps: list[tuple[torch.Tensor, torch.Tensor | None]] = (
            [(phase, 1 - dissolve), (phase - FORWARD_PERIOD, dissolve)] if bool(dissolve.any()) else [(phase, None)]
        )
        out: dict[Layer, list[tuple[torch.Tensor, torch.Tensor | None]]] = {}
        out[Layer.SKY] = [(aligned(xr + YAW_RATE[Layer.SKY] * f * yaw, yr), None)]
        approach = FAR_APPROACH * torch.tanh(tz / FAR_APPROACH)  # bounded: never reaches them
        for layer in (Layer.FAR, Layer.MID):
            depth = LAYER_DEPTH[layer]
            scale = (depth - approach) / depth
            x = xr * scale + f * tx / depth + YAW_RATE[layer] * f * yaw
            y = horizon + (yr - horizon) * scale - f * ty / depth
            out[layer] = [(aligned(x, y), None)]
        depth = LAYER_DEPTH[Layer.NEAR]
        out[Layer.NEAR] = []
        for offset, weight in steps:
            scale = (depth - offset) / depth
            x = xr * scale + f * tx / depth + YAW_RATE[Layer.NEAR] * f * yaw
            y = horizon + (yr - horizon) * scale - f * ty / depth
            out[Layer.NEAR].append((aligned(x, y), weight))
        below = yr - horizon  # the view's distance below the horizon
        on_ground = below > 1e-4
        d_view = torch.where(on_ground, below, torch.ones_like(below))
        nearest = f / (bh - self.hz0 + abs(tilt) * bw)  # no pixel of the start view's ground is nearer
        half = 0.5 * nearest
        out[Layer.GROUND] = []
        for offset, weight in steps:
            # the ground point the view sees there: depth f*h/d ahead, lateral x*h/d, in start coordinates
            depth_ahead = f * height / d_view + offset
            # nearer than the start view's bottom row (stepping back): the ground there continues
            # smoothly, mirrored, its depth eased into (nearest / 2, nearest): no point behind the camera
            if float(offset.min()) < 0:  # only the dissolve's step back can reach behind the camera
                eased = half + half * torch.exp(torch.clamp(depth_ahead - nearest, max=0) / half)
                depth_ahead = torch.where(depth_ahead >= nearest, depth_ahead, eased)
            d_src = f / depth_ahead
            x_src = (tx + xr * height / d_view) * d_src
            x = _fold(torch.where(on_ground, x_src, xr) + YAW_RATE[Layer.GROUND] * f * yaw, bw)
            y = torch.where(on_ground, self.hz0 + tilt * x + d_src, yr + tilt * (x - x_ground0))
            out[Layer.GROUND].append((grid(x, y), weight))
        return out
