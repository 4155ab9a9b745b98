"""Layout: the feature images of one session (geometry from its seed), and how they move."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from rtvideo.backend.builtin.scene.camera import DYNAMIC_LAYER, FEATURE_LAYER, CameraModel, Layer
from rtvideo.backend.builtin.scene.parameters import DYNAMIC_FEATURES, NAMED_INDEX, NAMED_PARAMS, STATIC_FEATURES
from rtvideo.backend.builtin.scene.textures import TextureBank, sigmoid, sine_pairs, smooth_ramp
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
        long_side = max(width, height)
        bw, bh = width / long_side, height / long_side
        xs = ((np.arange(rw) + 0.5) / rw * 2 - 1) * bw
        ys = ((np.arange(rh) + 0.5) / rh * 2 - 1) * bh
        X, Y = np.meshgrid(xs.astype(np.float32), ys.astype(np.float32))  # y grows downwards
        self._x, self._y, self._bw, self._bh = xs, ys, bw, bh
        px = 2 * bh / rh
        soft = 0.6 * px
        rng = np.random.default_rng([int(seed), 0x5CE7E])
        self.time_offset = float(rng.uniform(0, 100))

        # Horizon, sky and ground.
        hz0, tilt = bh * rng.uniform(-0.35, 0.35), rng.uniform(-0.05, 0.05)
        self._hz0, self._tilt = float(hz0), float(tilt)
        H = hz0 + tilt * X
        sky = sigmoid((H - Y) / soft)
        gnd = 1 - sky
        sky_h = hz0 + bh  # height of the sky at the centre
        g = np.clip((H - Y) / (H + bh), 0, 1)  # 0 at the horizon, 1 at the top
        d = np.clip((Y - H) / (bh - H), 0, 1)  # 0 at the horizon, 1 at the bottom
        depth = 1 / (d + 0.06)  # distance into the ground plane
        lateral = X * depth * 0.35
        fade = smooth_ramp(0.0, 0.22, d)  # ground detail fades toward the horizon (it would alias)

        def dist(cx: float, cy: float) -> np.ndarray:
            return np.hypot(X - cx, Y - cy)

        feats: dict[str, np.ndarray] = {"sky_top": sky * g, "sky_hor": sky * (1 - g)}
        xsun = bw * rng.uniform(-0.6, 0.6)
        hsun = hz0 + tilt * xsun
        hi_y, lo_y = hsun - 0.62 * (hsun + bh), hsun - 0.07 * (hsun + bh) - 0.01
        r_sun = 0.065
        to_sun = dist(xsun, hi_y) ** 2
        feats["sun_hi_glow"] = sky * (0.55 * np.exp(-to_sun / 0.03) + 0.45 * np.exp(-to_sun / 0.35))
        feats["sun_hi_disk"] = sky * sigmoid((r_sun - dist(xsun, hi_y)) / soft)
        ell = ((X - xsun) / 1.1) ** 2 + ((Y - lo_y) / 0.3) ** 2
        feats["sun_lo_glow"] = sky * (0.5 * np.exp(-(dist(xsun, lo_y) ** 2) / 0.02) + 0.5 * np.exp(-ell))
        feats["sun_lo_disk"] = sky * sigmoid((1.3 * r_sun - dist(xsun, lo_y)) / soft)
        xmoon = -np.sign(xsun) * bw * rng.uniform(0.2, 0.65)
        ymoon = hz0 + tilt * xmoon - 0.72 * (hz0 + tilt * xmoon + bh)
        feats["moon_glow"] = sky * np.exp(-(dist(xmoon, ymoon) ** 2) / 0.06)
        feats["moon_disk"] = (
            sky
            * sigmoid((0.045 - dist(xmoon, ymoon)) / soft)
            * (1 - 0.25 * sigmoid((0.03 - dist(xmoon + 0.012, ymoon - 0.008)) / soft))
        )
        feats["haze"] = 0.3 + 0.7 * np.exp(-np.abs(Y - H) / 0.18)
        feats["vignette"] = ((X / bw) ** 2 + (Y / bh) ** 2) / 2

        feats["gnd_far"], feats["gnd_near"] = gnd * (1 - d), gnd * d
        tex = np.zeros_like(X)
        for _ in range(6):
            k, phase = rng.uniform(1.5, 9.0), rng.uniform(0, 2 * np.pi)
            angle = rng.uniform(0, np.pi)
            tex += np.sin(k * (np.cos(angle) * lateral + np.sin(angle) * depth * 0.5) + phase) / np.sqrt(k)
        feats["gnd_tex"] = gnd * fade * tex / (tex.std() + 1e-6) * 0.5
        ridges = np.sin(1.3 * depth + 0.8 * np.sin(0.9 * lateral + rng.uniform(0, 6)) + rng.uniform(0, 6))
        feats["dunes"] = gnd * fade * ridges
        boards = (X - xsun * 0.3) / (d + 0.06) * 2.2
        seam = np.exp(-((np.sin(np.pi * boards) / 0.18) ** 2))
        tone = np.sin(np.floor(boards) * 12.9898 + rng.uniform(0, 6))
        feats["planks"] = gnd * fade * (0.35 * tone - seam)
        xv = bw * rng.uniform(-0.25, 0.25)
        lane = (X - xv) / (d + 0.02)
        line_w = 0.05 + px / (d + 0.02) * 0.6
        dashes = sigmoid(np.sin(depth * 3.0) / 0.2)
        markings = np.exp(-((lane / line_w) ** 2)) * dashes + np.exp(-(((np.abs(lane) - 1.6) / line_w) ** 2))
        feats["road"] = gnd * smooth_ramp(0.02, 0.12, d) * markings
        feats["reflect_lo"] = gnd * np.exp(-(((X - xsun) / (0.03 + 0.25 * d)) ** 2)) * (1 - d) ** 1.5
        feats["reflect_hi"] = gnd * np.exp(-(((X - xsun) / (0.05 + 0.2 * d)) ** 2)) * (1 - d) ** 2

        # Silhouettes standing on the horizon: pines, a skyline, a mountain range.
        def standing(profile: np.ndarray) -> np.ndarray:
            return sky * sigmoid((Y - (H - profile)) / soft)

        trees = np.full_like(xs, 0.03 * sky_h)
        for _ in range(int(34 * bw) + 6):
            cx, tree_h = rng.uniform(-bw - 0.1, bw + 0.1), sky_h * rng.uniform(0.1, 0.32)
            trees = np.maximum(trees, tree_h * (1 - np.abs(xs - cx) / (0.3 * tree_h)))
        feats["trees"] = standing(trees[None, :])
        heights = np.zeros_like(xs)
        x0, lefts, widths = -bw - 0.05, [], []
        while x0 < bw + 0.05:
            building_w = rng.uniform(0.06, 0.17)
            heights[(xs >= x0) & (xs < x0 + building_w)] = sky_h * rng.uniform(0.08, 0.45)
            lefts.append(x0)
            widths.append(building_w)
            x0 += building_w
        feats["buildings"] = standing(heights[None, :])
        cell_w, cell_h = max(0.035, 2.2 * px), max(0.045, 2.2 * px)
        col = np.floor((X + bw + 0.05) / cell_w).astype(np.int64)
        row = np.floor((H - Y) / cell_h).astype(np.int64)
        inner = (((X + bw + 0.05) / cell_w) % 1 < 0.55) & (((H - Y) / cell_h) % 1 < 0.6)
        lit = rng.random((col.max() + 2, max(row.max(), 0) + 2))
        cell_lit = lit[np.clip(col, 0, lit.shape[0] - 1), np.clip(row, 0, lit.shape[1] - 1)]
        below_roof = H - heights[None, :] + 0.5 * cell_h < Y
        win = feats["buildings"] * below_roof * inner * (row >= 0) * (cell_lit < 0.45)
        feats["windows_a"], feats["windows_b"] = win * (cell_lit < 0.3), win * (cell_lit >= 0.3)
        phases = rng.uniform(0, 2 * np.pi, 4)
        mtn = sky_h * np.clip(
            0.26
            + 0.15 * np.sin(1.7 * xs + phases[0])
            + 0.07 * np.sin(4.3 * xs + phases[1])
            + 0.035 * np.sin(9.1 * xs + phases[2])
            + 0.018 * np.sin(19.7 * xs + phases[3]),
            0.06,
            0.6,
        )
        feats["mountains"] = standing(mtn[None, :])
        feats["caps"] = feats["mountains"] * sigmoid(((H - 0.3 * sky_h) - Y) / soft)
        feats["trees_buildings"] = feats["trees"] * feats["buildings"]
        feats["trees_mountains"] = feats["trees"] * feats["mountains"]
        feats["buildings_mountains"] = feats["buildings"] * feats["mountains"]
        for name in ("trees", "buildings", "mountains"):
            feats[f"{name}_lo_glow"] = feats[name] * feats["sun_lo_glow"]
            feats[f"{name}_lo_disk"] = feats[name] * feats["sun_lo_disk"]
        lanterns = np.zeros_like(X)
        for _ in range(7):
            lx = rng.uniform(-bw, bw)
            ly_depth = rng.uniform(0.03, 0.3)
            ly = hz0 + tilt * lx + ly_depth * (bh - hz0) - 0.02
            size = 0.6 + 2.5 * ly_depth
            dl = dist(lx, ly)
            lanterns += np.exp(-((dl / (0.012 * size + px * 0.5)) ** 2)) + 0.3 * np.exp(-((dl / (0.07 * size)) ** 2))
        feats["lanterns"] = lanterns

        # A lighthouse away from the sun.
        xt = float(np.clip(xsun - np.sign(xsun or 1) * bw * rng.uniform(0.4, 0.7), -0.75 * bw, 0.75 * bw))
        ht = hz0 + tilt * xt
        base, top = ht + 0.05, ht - 0.52 * (ht + bh)
        u = (base - Y) / (base - top)
        half = 0.07 - 0.025 * np.clip(u, 0, 1)
        inside = sigmoid((half - np.abs(X - xt)) / soft) * sigmoid(u / 0.01) * sigmoid((1 - u) / 0.01)
        cap = sigmoid((0.035 - np.abs(X - xt)) / soft) * sigmoid((Y - (top - 0.07)) / soft) * sigmoid((top - Y) / soft)
        feats["tower"] = np.maximum(inside, cap)
        feats["tower_stripes"] = inside * sigmoid(np.sin(u * 2 * np.pi * 2.5) / 0.15) * (u < 0.85)
        feats["tower_shade"] = feats["tower"] * np.clip((X - xt) / 0.06, 0, 1)
        ly = top - 0.035
        feats["lamp"] = np.exp(-((dist(xt, ly) / 0.03) ** 2)) + 0.35 * np.exp(-((dist(xt, ly) / 0.12) ** 2))
        dx, dy = X - xt, Y - ly
        beam = (
            np.exp(-((dy / (0.012 + 0.1 * np.abs(dx))) ** 2))
            * np.exp(-np.abs(dx) / 1.6)
            * smooth_ramp(0.0, 0.05, np.abs(dx))
        )

        # A subject in the foreground: a car, or a sleeping cat.
        xs_ = bw * rng.uniform(-0.35, 0.35)
        ys_ = hz0 + tilt * xs_ + 0.55 * (bh - hz0 - tilt * xs_)
        sc = 0.7 + 0.4 * rng.random()
        edge = soft / (0.06 * sc)

        def blob(cx: float, cy: float, rx: float, ry: float, power: float = 2.0) -> np.ndarray:
            level = np.abs((X - cx) / (rx * sc)) ** power + np.abs((Y - cy) / (ry * sc)) ** power
            return sigmoid((1 - level) / edge)

        body = blob(xs_, ys_, 0.27, 0.055, 4)
        cabin = blob(xs_ - 0.02 * sc, ys_ - 0.075 * sc, 0.15, 0.045, 3) * (1 - body)
        glass = blob(xs_ - 0.02 * sc, ys_ - 0.072 * sc, 0.125, 0.03, 3) * cabin
        wheels = sum(blob(xs_ + side * 0.16 * sc, ys_ + 0.05 * sc, 0.045, 0.045) for side in (-1, 1))
        feats["vehicle"] = body + cabin
        feats["vehicle_glass"] = glass
        feats["wheels"] = np.clip(wheels, 0, 1) * (1 - body)
        loaf = blob(xs_, ys_, 0.21, 0.075)
        head = blob(xs_ + 0.17 * sc, ys_ - 0.045 * sc, 0.065, 0.06) * (1 - loaf)
        feats["creature"] = loaf + head
        ears = np.zeros_like(X)
        for ex in (0.135, 0.2):
            ecx, etop = xs_ + ex * sc, ys_ - 0.14 * sc
            ears += sigmoid((0.55 * (Y - etop) - np.abs(X - ecx)) / soft) * sigmoid((ys_ - 0.085 * sc - Y) / soft)
        feats["ears"] = np.clip(ears, 0, 1) * (1 - feats["creature"])
        subject = np.clip(feats["vehicle"] + feats["creature"], 0, 1)
        feats["subject_top"] = subject * np.clip((ys_ - Y) / (0.12 * sc), 0, 1)
        shadow = ((X - xs_) / (0.34 * sc)) ** 2 + ((Y - ys_ - 0.08 * sc) / (0.03 * sc)) ** 2
        feats["subject_shadow"] = np.exp(-shadow) * (1 - subject)

        # Stars (two twinkling sets), the lighthouse beam (sweeping left, then right), fire glow, waves.
        stars = [np.zeros(rh * rw), np.zeros(rh * rw)]
        count = int(110 * bw * bh) + 10
        sx, sy = rng.uniform(-bw, bw, count), rng.uniform(-bh, bh, count)
        sb = rng.uniform(0.25, 1.0, count) ** 2
        ci = np.clip(np.round((sx + bw) / (2 * bw) * rw - 0.5).astype(int), 0, rw - 1)
        ri = np.clip(np.round((sy + bh) / (2 * bh) * rh - 0.5).astype(int), 0, rh - 1)
        for n in range(count):
            stars[n % 2][ri[n] * rw + ci[n]] += sb[n]
        star_zone = (sky * smooth_ramp(0.25, 0.45, g)).reshape(-1)
        fire_x = bw * rng.uniform(-0.25, 0.25)
        fire_base = hz0 + tilt * fire_x + 0.6 * (bh - hz0 - tilt * fire_x)
        fire_h = 0.62 * (fire_base + bh)
        glow = np.exp(-((dist(fire_x, fire_base - 0.25 * fire_h) / (0.75 * fire_h)) ** 2))
        mod_rows = [
            stars[0] * star_zone,
            stars[1] * star_zone,
            beam.reshape(-1) * (dx < 0).reshape(-1),
            beam.reshape(-1) * (dx >= 0).reshape(-1),
            glow.reshape(-1),
        ]
        mod_params = [NAMED_INDEX["stars"]] * 2 + [NAMED_INDEX["beam"]] * 2 + [NAMED_INDEX["fire_glow"]]
        self._star_phase = rng.uniform(0, 2 * np.pi, 2)
        wave_k = rng.uniform(2.0, 4.5, 5)
        wave_lat = rng.uniform(-0.6, 0.6, 5)
        self._wave_omega = rng.uniform(1.2, 2.6, 5)
        wave_amp = np.array([1.0, 0.7, 0.5, 0.35, 0.25])
        self._wave_rows = slice(len(mod_rows), len(mod_rows) + 10)
        for m in range(5):
            psi = wave_k[m] * depth + wave_lat[m] * lateral * wave_k[m] + rng.uniform(0, 2 * np.pi)
            for basis in (np.sin(psi), np.cos(psi)):
                mod_rows.append((gnd * fade * wave_amp[m] * 0.55 * basis).reshape(-1))
                mod_params.append(NAMED_INDEX["ripple"])
        tphase = rng.uniform(0, 2 * np.pi, texture.count)
        self._texture = texture
        mod_rows += list(sine_pairs(X, Y, texture.vectors, tphase) * np.repeat(texture.amplitudes, 2)[:, None])
        mod_params += [len(NAMED_PARAMS) + m for m in range(texture.count) for _ in range(2)]

        # Dynamic: clouds (noise drifting sideways) and flames (noise rising), as sine bases.
        nc = 14
        self._cloud_k = np.stack(
            [rng.uniform(1.0, 4.0, nc) * rng.choice([-1, 1], nc), rng.uniform(2.0, 8.0, nc)], axis=1
        )
        self._cloud_speed = rng.uniform(0.06, 0.1) * rng.choice([-1, 1])
        cloud_phase = rng.uniform(0, 2 * np.pi, nc)
        cloud_amp = 1 / np.sqrt(np.abs(self._cloud_k[:, 0] * self._cloud_k[:, 1]))
        cloud_amp /= np.sqrt((cloud_amp**2).sum() / 2)
        cloud_rows = sine_pairs(X, Y, self._cloud_k, cloud_phase) * np.repeat(cloud_amp, 2)[:, None]
        self._cloud_zone = sky * smooth_ramp(0.12, 0.5, g)
        self._fire_k = np.stack([rng.uniform(7, 20, 10) * rng.choice([-1, 1], 10), rng.uniform(3, 10, 10)], axis=1)
        self._fire_speed = 0.75 * (fire_h / 0.6)
        fire_phase = rng.uniform(0, 2 * np.pi, 10)
        fire_amp = 1 / np.sqrt(np.hypot(self._fire_k[:, 0], self._fire_k[:, 1]))
        fire_amp /= np.sqrt((fire_amp**2).sum() / 2)
        fire_rows = sine_pairs(X, Y, self._fire_k, fire_phase) * np.repeat(fire_amp, 2)[:, None]
        fu = (fire_base - Y) / fire_h
        fire_w = 0.24 * (fire_h / 0.6) * np.clip(1 - fu, 0, 1) ** 0.7 + 1e-3
        self._fire_envelope = (
            np.exp(-(((X - fire_x) / fire_w) ** 2)) * smooth_ramp(-0.05, 0.03, fu) * np.clip(1 - fu, 0, 1) ** 0.5
        )

        # Particles: snowflakes (near ones blurred) and raindrops, wrapping around the frame.
        n_snow = int(150 * bw * bh) + 20
        self._snow = {
            "x": rng.uniform(-bw, bw, n_snow),
            "y": rng.uniform(-bh, bh, n_snow),
            "z": rng.uniform(0, 1, n_snow),
            "omega": rng.uniform(0.7, 2.0, n_snow),
            "phase": rng.uniform(0, 2 * np.pi, n_snow),
        }
        n_rain = int(120 * bw * bh) + 20
        self._rain = {
            "x": rng.uniform(-bw, bw, n_rain),
            "y": rng.uniform(-bh, bh, n_rain),
            "z": rng.uniform(0, 1, n_rain),
        }

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
        self.camera = CameraModel(bw=bw, bh=bh, hz0=self._hz0, tilt=self._tilt, xs=xs, ys=ys)

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
