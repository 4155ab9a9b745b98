"""Layout: the feature images of one session (geometry from its seed), and how they move."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from rtvideo.backend.builtin.scene.camera import DYNAMIC_LAYER, FEATURE_LAYER, CameraModel, Layer
from rtvideo.backend.builtin.scene.features import (
    Features,
    canvas,
    dynamic,
    lighthouse,
    modulated,
    particles,
    silhouettes,
    sky_and_ground,
    subject,
)
from rtvideo.backend.builtin.scene.parameters import DYNAMIC_FEATURES, NAMED_INDEX, NAMED_PARAMS, STATIC_FEATURES
from rtvideo.backend.builtin.scene.textures import TextureBank
from rtvideo.core.pose import Pose


class SceneLayout:
    """The feature images of one session at its render size, and how they move.

    `render(params, frame_times)` → [T, 3, h, w] in [0, 1]: the per-pixel sum of
    feature images times their RGB coefficients (`params`, [3, K]), clipped.
    """

    def __init__(
        self,
        *,
        width: int,
        height: int,
        render_size: tuple[int, int],
        seed: int,
        texture: TextureBank,
        device: torch.device,
    ) -> None:
        rh, rw = render_size
        self.render_size, self.device = (rh, rw), device
        # one generator, drawn from in this order: the same seed gives the same scene, bit for bit
        rng = np.random.default_rng([int(seed), 0x5CE7E])
        self.time_offset = float(rng.uniform(0, 100))
        c = canvas(width, height, render_size, rng)
        self._x, self._y, self._bw, self._bh = c.xs, c.ys, c.bw, c.bh
        self._hz0, self._tilt = float(c.hz0), float(c.tilt)
        feats: Features = {}
        xsun = sky_and_ground(c, rng, feats)
        silhouettes(c, rng, feats)
        beam, dx = lighthouse(c, rng, feats, xsun)
        subject(c, rng, feats)
        mod = modulated(c, rng, beam, dx, texture)
        mod_rows, mod_params = mod.rows, mod.params
        self._star_phase, self._wave_omega, self._wave_rows = mod.star_phase, mod.wave_omega, mod.wave_rows
        self._texture = texture
        dyn = dynamic(c, rng, mod.fire)
        self._cloud_k, self._cloud_speed, self._cloud_zone = dyn.cloud_k, dyn.cloud_speed, dyn.cloud_zone
        self._fire_k, self._fire_speed, self._fire_envelope = dyn.fire_k, dyn.fire_speed, dyn.fire_envelope
        cloud_rows, fire_rows = dyn.cloud_rows, dyn.fire_rows
        self._snow, self._rain = particles(c, rng)

        def tensor(a: np.ndarray | list) -> torch.Tensor:
            rows = np.stack([np.asarray(r, dtype=np.float32).reshape(-1) for r in a]) if isinstance(a, list) else a
            return torch.as_tensor(np.ascontiguousarray(rows, dtype=np.float32), device=device)

        self.static = tensor([feats[name] for name in STATIC_FEATURES])  # [Ks, P]
        self.modulated = tensor(mod_rows)  # [J, P]
        self._mod_params = torch.as_tensor(mod_params, dtype=torch.long, device=device)
        self._cloud_basis = tensor(cloud_rows)
        self._cloud_zone_t = tensor(self._cloud_zone.reshape(-1))
        self._fire_basis = tensor(fire_rows)
        self._fire_env_t = tensor(self._fire_envelope.reshape(-1))
        self._reflect = tensor([feats["reflect_lo"], feats["reflect_hi"]])
        self._blur = torch.tensor([[1, 2, 1], [2, 4, 2], [1, 2, 1]], dtype=torch.float32, device=device).div_(16)
        self.param_count = len(NAMED_PARAMS) + texture.count
        self._dyn_index = {name: NAMED_INDEX[name] for name in DYNAMIC_FEATURES}
        # the camera's layers (`_render_moving`): which static features and modulated rows each holds
        mod_layers = [Layer.SKY, Layer.SKY, Layer.MID, Layer.MID, Layer.NEAR]
        mod_layers += [Layer.GROUND] * (self._wave_rows.stop - self._wave_rows.start)
        mod_layers += [Layer.SKY] * (len(mod_rows) - len(mod_layers))
        self._layer_rows = {
            layer: (
                torch.as_tensor(
                    [i for i, n in enumerate(STATIC_FEATURES) if FEATURE_LAYER[n] is layer], dtype=torch.long
                ),
                torch.as_tensor([j for j, m in enumerate(mod_layers) if m is layer], dtype=torch.long),
            )
            for layer in Layer
        }
        self.camera = CameraModel(bw=c.bw, bh=c.bh, hz0=self._hz0, tilt=self._tilt, xs=c.xs, ys=c.ys)

    # -- per frame ------------------------------------------------------------------

    def _modulations(self, t: np.ndarray) -> np.ndarray:
        """[T, J] multipliers of the modulated rows at times `t` (seconds, float64)."""
        cols = [1 + 0.55 * np.sin(2.3 * t + self._star_phase[0]), 1 + 0.55 * np.sin(3.1 * t + self._star_phase[1])]
        sweep = np.cos(2 * np.pi * t / 7.0)
        cols += [np.maximum(sweep, 0) ** 2, np.maximum(-sweep, 0) ** 2]
        cols.append(1 + 0.12 * np.sin(11.0 * t) + 0.08 * np.sin(17.3 * t + 1.0))
        for omega in self._wave_omega:  # sin(psi + w t) = sin(psi) cos(w t) + cos(psi) sin(w t)
            cols += [np.cos(omega * t), np.sin(omega * t)]
        for omega in self._texture.omegas:
            cols += [np.cos(omega * t), np.sin(omega * t)]
        return np.stack(cols, axis=1)

    @staticmethod
    def _shift(k: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        """[T, 2M] weights that move a sine basis (sin, cos pairs) by phase k*offset."""
        phase = offsets[:, None] * k[None, :]
        out = np.empty((len(offsets), 2 * len(k)))
        out[:, 0::2], out[:, 1::2] = np.cos(phase), np.sin(phase)
        return out

    def _tensor(self, a: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(a.astype(np.float32), device=self.device)

    def _splat(self, xs: np.ndarray, ys: np.ndarray, weights: np.ndarray) -> torch.Tensor:
        """[T, P]: points [T, N] at (xs, ys) with `weights` [T, N], bilinearly spread over pixels."""
        rh, rw = self.render_size
        fx = (xs + self._bw) / (2 * self._bw) * rw - 0.5
        fy = (ys + self._bh) / (2 * self._bh) * rh - 0.5
        x0, y0 = np.floor(fx), np.floor(fy)
        ax, ay = fx - x0, fy - y0
        frames = np.arange(xs.shape[0])[:, None] * (rh * rw)
        idx, val = [], []
        for oy, wy in ((0, 1 - ay), (1, ay)):
            for ox, wx in ((0, 1 - ax), (1, ax)):
                cx, cy = x0 + ox, y0 + oy
                ok = (cx >= 0) & (cx < rw) & (cy >= 0) & (cy < rh)
                idx.append((frames + cy * rw + cx)[ok])
                val.append((weights * wx * wy)[ok])
        out = torch.zeros(xs.shape[0] * rh * rw, device=self.device)
        out.index_add_(
            0,
            torch.as_tensor(np.concatenate(idx).astype(np.int64), device=self.device),
            self._tensor(np.concatenate(val)),
        )
        return out.view(xs.shape[0], rh * rw)

    def _snowfall(self, t: np.ndarray) -> torch.Tensor:
        s, bw, bh = self._snow, self._bw, self._bh
        tt = t[:, None]
        speed = 0.1 + 0.22 * s["z"]
        x = s["x"] + (0.015 + 0.03 * s["z"]) * np.sin(s["omega"] * tt + s["phase"]) + 0.02 * tt
        y = s["y"] + speed * tt
        x = (x + bw + 0.05) % (2 * bw + 0.1) - bw - 0.05
        y = (y + bh + 0.05) % (2 * bh + 0.1) - bh - 0.05
        near = s["z"] > 0.6
        bright = np.broadcast_to(0.45 + 0.55 * s["z"], x.shape)
        rh, rw = self.render_size
        far_img = self._splat(x[:, ~near], y[:, ~near], bright[:, ~near])
        near_img = self._splat(x[:, near], y[:, near], 2.2 * bright[:, near]).view(-1, 1, rh, rw)
        near_img = F.conv2d(near_img, self._blur.view(1, 1, 3, 3), padding=1).view(-1, rh * rw)
        return (far_img + near_img).clamp_(max=1.5)

    def _rainfall(self, t: np.ndarray) -> torch.Tensor:
        r, bw, bh = self._rain, self._bw, self._bh
        tt = t[:, None]
        speed = 1.6 + 1.2 * r["z"]
        xs, ys, ws = [], [], []
        for step in range(4):  # a streak: four points along the fall
            back = step * 0.022 * (0.6 + r["z"])
            y = (r["y"] + speed * tt - back + bh + 0.1) % (2 * bh + 0.2) - bh - 0.1
            x = (r["x"] + 0.18 * (speed * tt - back) + bw + 0.1) % (2 * bw + 0.2) - bw - 0.1
            xs.append(x)
            ys.append(y)
            ws.append(np.broadcast_to((0.3 + 0.5 * r["z"]) * (1 - 0.2 * step), x.shape))
        return self._splat(np.concatenate(xs, 1), np.concatenate(ys, 1), np.concatenate(ws, 1)).clamp_(max=1.2)

    def _dynamic(
        self, params: torch.Tensor, t: np.ndarray, mods: torch.Tensor
    ) -> Iterator[tuple[str, Callable[[], torch.Tensor]]]:
        """The per-frame features the chunk's coefficients switch on, in a fixed order: (name, feature)."""
        present = {name: bool(params[:, index].any()) for name, index in self._dyn_index.items()}

        def clouds() -> torch.Tensor:
            noise = self._tensor(self._shift(self._cloud_k[:, 0], -self._cloud_speed * t)) @ self._cloud_basis
            return (1.3 * noise - 0.15).clamp_(0, 1).pow_(1.5) * self._cloud_zone_t

        if present["clouds"]:  # an absent element costs nothing
            yield "clouds", clouds
        if present["glint_lo"] or present["glint_hi"]:
            waves = mods[:, self._wave_rows] @ self.modulated[self._wave_rows]  # [T, P]
            sparkle = (waves - 0.3).clamp_(min=0) * 2.5
            if present["glint_lo"]:
                yield "glint_lo", lambda: sparkle * self._reflect[0]
            if present["glint_hi"]:
                yield "glint_hi", lambda: sparkle * self._reflect[1]
        if present["flames"] or present["flame_core"]:
            noise = self._tensor(self._shift(self._fire_k[:, 1], self._fire_speed * t)) @ self._fire_basis
            if present["flames"]:
                yield "flames", lambda: (self._fire_env_t * (1.5 + 1.1 * noise) - 0.35).clamp_(0, 1)
            if present["flame_core"]:
                yield "flame_core", lambda: (self._fire_env_t * (2.2 + 1.0 * noise) - 1.3).clamp_(0, 1)
        if present["snowfall"]:
            yield "snowfall", lambda: self._snowfall(t)
        if present["rain"]:
            yield "rain", lambda: self._rainfall(t)

    def render(
        self, params: torch.Tensor, frame_times: np.ndarray, poses: Sequence[Pose] | None = None
    ) -> torch.Tensor:
        """[T, 3, h, w] in [0, 1] for coefficients `params` [3, K] at session times `frame_times` (s),
        seen from the camera `poses` (one per frame; None: the start pose, a fixed camera)."""
        t = np.asarray(frame_times, dtype=np.float64) + self.time_offset
        rh, rw = self.render_size
        mods = self._tensor(self._modulations(t))  # [T, J]
        if poses is not None:
            return self._render_moving(params, t, mods, poses)
        coeff = params[:, self._mod_params]  # [3, J]
        out = torch.matmul(mods[:, None, :] * coeff[None], self.modulated)  # [T, 3, P]
        out += (params[:, : len(STATIC_FEATURES)] @ self.static)[None]
        for name, feature in self._dynamic(params, t, mods):
            out.add_(params[:, self._dyn_index[name]][None, :, None] * feature()[:, None, :])
        return out.clamp_(0, 1).view(len(t), 3, rh, rw)

    def _render_moving(
        self, params: torch.Tensor, t: np.ndarray, mods: torch.Tensor, poses: Sequence[Pose]
    ) -> torch.Tensor:
        """The same sum of features, split into depth layers, each resampled as the camera sees
        it (`CameraModel.grids`), then summed and clipped. At the start pose every grid is the
        identity, so a camera that comes back shows the start view."""
        rh, rw = self.render_size
        frames = len(t)
        coeff = params[:, self._mod_params]
        layers: dict[Layer, torch.Tensor] = {}
        for layer, (static_rows, mod_rows) in self._layer_rows.items():
            image = torch.zeros(frames, 3, rh * rw, device=self.device)
            if len(mod_rows):
                rows = mod_rows.to(self.device)
                image += torch.matmul(mods[:, None, rows] * coeff[None][:, :, rows], self.modulated[rows])
            if len(static_rows):
                rows = static_rows.to(self.device)
                image += (params[:, rows] @ self.static[rows])[None]
            layers[layer] = image
        for name, feature in self._dynamic(params, t, mods):
            layers[DYNAMIC_LAYER[name]].add_(params[:, self._dyn_index[name]][None, :, None] * feature()[:, None, :])
        out = layers.pop(Layer.SCREEN).view(frames, 3, rh, rw)
        grids = self.camera.grids(poses)
        for layer, image in layers.items():
            for grid, weight in grids[layer]:
                warped = F.grid_sample(
                    image.view(frames, 3, rh, rw),
                    grid.to(self.device),
                    mode="bilinear",
                    padding_mode="reflection",  # the scene continues mirrored, as `_fold` has it
                    align_corners=False,
                )
                if weight is None:
                    out += warped
                else:
                    out += warped * weight.to(self.device).view(-1, 1, 1, 1)
        return out.clamp_(0, 1)
