"""A camera pose, the seam between camera control (`rtvideo.core.camera`) and the renderers.

Unity axes, as vLLM-Omni's `SE3DeltaCameraHandler` has them: +X right, +Y up, +Z forward.
A pose is relative to the session's start pose (`IDENTITY`). Invariant: `rotation` is a unit
quaternion `(x, y, z, w)`; `translation` is in scene units (one unit ~ the distance the
built-in scene's camera covers in one second at walking speed).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Pose:
    translation: tuple[float, float, float] = (0.0, 0.0, 0.0)
    rotation: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 1.0)


IDENTITY = Pose()
