"""The feature images of one session's scene, built section by section from its seed.

Each function draws from the session's one `rng` in a fixed order (the order `SceneLayout`
calls them in): the same seed gives the same scene, bit for bit. Every image is an array over
the render grid (`Canvas`), in scene units where the long side spans [-1, 1] and y grows
downwards.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rtvideo.backend.builtin.scene.parameters import NAMED_INDEX, NAMED_PARAMS
from rtvideo.backend.builtin.scene.textures import TextureBank, sigmoid, sine_pairs, smooth_ramp

Features = dict[str, np.ndarray]


@dataclass(frozen=True)
class Canvas:
    """The render grid in scene units, and the horizon every feature stands on."""

    X: np.ndarray  # [h, w] x of each pixel
    Y: np.ndarray  # [h, w] y of each pixel (downwards)
    xs: np.ndarray  # [w]
    ys: np.ndarray  # [h]
    bw: float  # half the frame's width, in scene units
    bh: float  # half its height
    px: float  # one pixel
    soft: float  # the anti-aliasing edge
    hz0: float  # the horizon's height at x = 0
    tilt: float  # its slope
    H: np.ndarray  # the horizon's height under each pixel
    sky: np.ndarray  # 1 above the horizon
    gnd: np.ndarray  # 1 below it
    g: np.ndarray  # 0 at the horizon, 1 at the top
    d: np.ndarray  # 0 at the horizon, 1 at the bottom
    depth: np.ndarray  # distance into the ground plane
    lateral: np.ndarray  # sideways position on the ground plane
    fade: np.ndarray  # ground detail fades toward the horizon (it would alias)
    sky_h: float  # the sky's height at the centre

    def dist(self, cx: float, cy: float) -> np.ndarray:
        return np.hypot(self.X - cx, self.Y - cy)


def canvas(width: int, height: int, render_size: tuple[int, int], rng: np.random.Generator) -> Canvas:
    """The grid of a `width`×`height` frame rendered at `render_size` (h, w), with a random horizon."""
    rh, rw = render_size
    long_side = max(width, height)
    bw, bh = width / long_side, height / long_side
    xs = ((np.arange(rw) + 0.5) / rw * 2 - 1) * bw
    ys = ((np.arange(rh) + 0.5) / rh * 2 - 1) * bh
    X, Y = np.meshgrid(xs.astype(np.float32), ys.astype(np.float32))  # y grows downwards
    px = 2 * bh / rh
    soft = 0.6 * px
    hz0, tilt = bh * rng.uniform(-0.35, 0.35), rng.uniform(-0.05, 0.05)
    H = hz0 + tilt * X
    sky = sigmoid((H - Y) / soft)
    d = np.clip((Y - H) / (bh - H), 0, 1)
    depth = 1 / (d + 0.06)
    return Canvas(
        X=X,
        Y=Y,
        xs=xs,
        ys=ys,
        bw=bw,
        bh=bh,
        px=px,
        soft=soft,
        hz0=hz0,
        tilt=tilt,
        H=H,
        sky=sky,
        gnd=1 - sky,
        g=np.clip((H - Y) / (H + bh), 0, 1),
        d=d,
        depth=depth,
        lateral=X * depth * 0.35,
        fade=smooth_ramp(0.0, 0.22, d),
        sky_h=hz0 + bh,
    )


def sky_and_ground(c: Canvas, rng: np.random.Generator, feats: Features) -> float:
    """Sky gradients, the sun (high and low), the moon, haze, the ground's textures, a road and
    the sun's reflection. Returns the sun's x (the lighthouse stands away from it)."""
    X, Y, H, sky, gnd, g, d, bw, bh = c.X, c.Y, c.H, c.sky, c.gnd, c.g, c.d, c.bw, c.bh
    soft, hz0, tilt = c.soft, c.hz0, c.tilt
    feats["sky_top"], feats["sky_hor"] = sky * g, sky * (1 - g)
    xsun = bw * rng.uniform(-0.6, 0.6)
    hsun = hz0 + tilt * xsun
    hi_y, lo_y = hsun - 0.62 * (hsun + bh), hsun - 0.07 * (hsun + bh) - 0.01
    r_sun = 0.065
    to_sun = c.dist(xsun, hi_y) ** 2
    feats["sun_hi_glow"] = sky * (0.55 * np.exp(-to_sun / 0.03) + 0.45 * np.exp(-to_sun / 0.35))
    feats["sun_hi_disk"] = sky * sigmoid((r_sun - c.dist(xsun, hi_y)) / soft)
    ell = ((X - xsun) / 1.1) ** 2 + ((Y - lo_y) / 0.3) ** 2
    feats["sun_lo_glow"] = sky * (0.5 * np.exp(-(c.dist(xsun, lo_y) ** 2) / 0.02) + 0.5 * np.exp(-ell))
    feats["sun_lo_disk"] = sky * sigmoid((1.3 * r_sun - c.dist(xsun, lo_y)) / soft)
    xmoon = -np.sign(xsun) * bw * rng.uniform(0.2, 0.65)
    ymoon = hz0 + tilt * xmoon - 0.72 * (hz0 + tilt * xmoon + bh)
    feats["moon_glow"] = sky * np.exp(-(c.dist(xmoon, ymoon) ** 2) / 0.06)
    feats["moon_disk"] = (
        sky
        * sigmoid((0.045 - c.dist(xmoon, ymoon)) / soft)
        * (1 - 0.25 * sigmoid((0.03 - c.dist(xmoon + 0.012, ymoon - 0.008)) / soft))
    )
    feats["haze"] = 0.3 + 0.7 * np.exp(-np.abs(Y - H) / 0.18)
    feats["vignette"] = ((X / bw) ** 2 + (Y / bh) ** 2) / 2

    depth, lateral, fade = c.depth, c.lateral, c.fade
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
    line_w = 0.05 + c.px / (d + 0.02) * 0.6
    dashes = sigmoid(np.sin(depth * 3.0) / 0.2)
    markings = np.exp(-((lane / line_w) ** 2)) * dashes + np.exp(-(((np.abs(lane) - 1.6) / line_w) ** 2))
    feats["road"] = gnd * smooth_ramp(0.02, 0.12, d) * markings
    feats["reflect_lo"] = gnd * np.exp(-(((X - xsun) / (0.03 + 0.25 * d)) ** 2)) * (1 - d) ** 1.5
    feats["reflect_hi"] = gnd * np.exp(-(((X - xsun) / (0.05 + 0.2 * d)) ** 2)) * (1 - d) ** 2
    return xsun


def silhouettes(c: Canvas, rng: np.random.Generator, feats: Features) -> None:
    """What stands on the horizon: pines, a skyline with lit windows, a mountain range with
    snow caps, their overlaps and sun-lit variants, and lanterns on the ground."""
    X, Y, H, sky, xs, bw, bh, px, soft, sky_h = c.X, c.Y, c.H, c.sky, c.xs, c.bw, c.bh, c.px, c.soft, c.sky_h

    def standing(profile: np.ndarray) -> np.ndarray:
        return sky * sigmoid((Y - (H - profile)) / soft)

    trees = np.full_like(xs, 0.03 * sky_h)
    for _ in range(int(34 * bw) + 6):
        cx, tree_h = rng.uniform(-bw - 0.1, bw + 0.1), sky_h * rng.uniform(0.1, 0.32)
        trees = np.maximum(trees, tree_h * (1 - np.abs(xs - cx) / (0.3 * tree_h)))
    feats["trees"] = standing(trees[None, :])
    heights = np.zeros_like(xs)
    x0 = -bw - 0.05
    while x0 < bw + 0.05:
        building_w = rng.uniform(0.06, 0.17)
        heights[(xs >= x0) & (xs < x0 + building_w)] = sky_h * rng.uniform(0.08, 0.45)
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
        ly = c.hz0 + c.tilt * lx + ly_depth * (bh - c.hz0) - 0.02
        size = 0.6 + 2.5 * ly_depth
        dl = c.dist(lx, ly)
        lanterns += np.exp(-((dl / (0.012 * size + px * 0.5)) ** 2)) + 0.3 * np.exp(-((dl / (0.07 * size)) ** 2))
    feats["lanterns"] = lanterns


def lighthouse(c: Canvas, rng: np.random.Generator, feats: Features, xsun: float) -> tuple[np.ndarray, np.ndarray]:
    """A striped tower away from the sun and its lamp; returns its beam and each pixel's x from
    the lamp (the beam sweeps left, then right)."""
    X, Y, bw, bh, soft = c.X, c.Y, c.bw, c.bh, c.soft
    xt = float(np.clip(xsun - np.sign(xsun or 1) * bw * rng.uniform(0.4, 0.7), -0.75 * bw, 0.75 * bw))
    ht = c.hz0 + c.tilt * xt
    base, top = ht + 0.05, ht - 0.52 * (ht + bh)
    u = (base - Y) / (base - top)
    half = 0.07 - 0.025 * np.clip(u, 0, 1)
    inside = sigmoid((half - np.abs(X - xt)) / soft) * sigmoid(u / 0.01) * sigmoid((1 - u) / 0.01)
    cap = sigmoid((0.035 - np.abs(X - xt)) / soft) * sigmoid((Y - (top - 0.07)) / soft) * sigmoid((top - Y) / soft)
    feats["tower"] = np.maximum(inside, cap)
    feats["tower_stripes"] = inside * sigmoid(np.sin(u * 2 * np.pi * 2.5) / 0.15) * (u < 0.85)
    feats["tower_shade"] = feats["tower"] * np.clip((X - xt) / 0.06, 0, 1)
    ly = top - 0.035
    feats["lamp"] = np.exp(-((c.dist(xt, ly) / 0.03) ** 2)) + 0.35 * np.exp(-((c.dist(xt, ly) / 0.12) ** 2))
    dx, dy = X - xt, Y - ly
    beam = (
        np.exp(-((dy / (0.012 + 0.1 * np.abs(dx))) ** 2))
        * np.exp(-np.abs(dx) / 1.6)
        * smooth_ramp(0.0, 0.05, np.abs(dx))
    )
    return beam, dx


def subject(c: Canvas, rng: np.random.Generator, feats: Features) -> None:
    """A subject in the foreground, a car or a sleeping cat (the prompt picks), and its shadow."""
    X, Y, bw, bh, hz0, tilt = c.X, c.Y, c.bw, c.bh, c.hz0, c.tilt
    xs_ = bw * rng.uniform(-0.35, 0.35)
    ys_ = hz0 + tilt * xs_ + 0.55 * (bh - hz0 - tilt * xs_)
    sc = 0.7 + 0.4 * rng.random()
    edge = c.soft / (0.06 * sc)

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
        ears += sigmoid((0.55 * (Y - etop) - np.abs(X - ecx)) / c.soft) * sigmoid((ys_ - 0.085 * sc - Y) / c.soft)
    feats["ears"] = np.clip(ears, 0, 1) * (1 - feats["creature"])
    both = np.clip(feats["vehicle"] + feats["creature"], 0, 1)
    feats["subject_top"] = both * np.clip((ys_ - Y) / (0.12 * sc), 0, 1)
    shadow = ((X - xs_) / (0.34 * sc)) ** 2 + ((Y - ys_ - 0.08 * sc) / (0.03 * sc)) ** 2
    feats["subject_shadow"] = np.exp(-shadow) * (1 - both)


@dataclass(frozen=True)
class Fire:
    """Where the camp fire burns (its glow is modulated; its flames are dynamic)."""

    x: float
    base: float
    height: float


@dataclass(frozen=True)
class Modulated:
    """Images whose weight changes per frame: twinkling stars, the sweeping beam, the fire's
    glow, ground waves (sine pairs) and the global texture."""

    rows: list[np.ndarray]  # [J] flattened images
    params: list[int]  # [J] the named parameter (RGB coefficient) each row takes
    star_phase: np.ndarray  # [2]
    wave_omega: np.ndarray  # [5]
    wave_rows: slice  # the rows of the waves
    fire: Fire


def modulated(c: Canvas, rng: np.random.Generator, beam: np.ndarray, dx: np.ndarray, texture: TextureBank) -> Modulated:
    """The modulated rows (stars in two twinkling sets, the beam's two sides, the fire's glow,
    waves, the texture), in the order `SceneLayout._modulations` weights them."""
    X, Y, bw, bh, hz0, tilt = c.X, c.Y, c.bw, c.bh, c.hz0, c.tilt
    rh, rw = X.shape
    stars = [np.zeros(rh * rw), np.zeros(rh * rw)]
    count = int(110 * bw * bh) + 10
    sx, sy = rng.uniform(-bw, bw, count), rng.uniform(-bh, bh, count)
    sb = rng.uniform(0.25, 1.0, count) ** 2
    ci = np.clip(np.round((sx + bw) / (2 * bw) * rw - 0.5).astype(int), 0, rw - 1)
    ri = np.clip(np.round((sy + bh) / (2 * bh) * rh - 0.5).astype(int), 0, rh - 1)
    for n in range(count):
        stars[n % 2][ri[n] * rw + ci[n]] += sb[n]
    star_zone = (c.sky * smooth_ramp(0.25, 0.45, c.g)).reshape(-1)
    fire_x = bw * rng.uniform(-0.25, 0.25)
    fire_base = hz0 + tilt * fire_x + 0.6 * (bh - hz0 - tilt * fire_x)
    fire_h = 0.62 * (fire_base + bh)
    glow = np.exp(-((c.dist(fire_x, fire_base - 0.25 * fire_h) / (0.75 * fire_h)) ** 2))
    rows = [
        stars[0] * star_zone,
        stars[1] * star_zone,
        beam.reshape(-1) * (dx < 0).reshape(-1),
        beam.reshape(-1) * (dx >= 0).reshape(-1),
        glow.reshape(-1),
    ]
    params = [NAMED_INDEX["stars"]] * 2 + [NAMED_INDEX["beam"]] * 2 + [NAMED_INDEX["fire_glow"]]
    star_phase = rng.uniform(0, 2 * np.pi, 2)
    wave_k = rng.uniform(2.0, 4.5, 5)
    wave_lat = rng.uniform(-0.6, 0.6, 5)
    wave_omega = rng.uniform(1.2, 2.6, 5)
    wave_amp = np.array([1.0, 0.7, 0.5, 0.35, 0.25])
    wave_rows = slice(len(rows), len(rows) + 10)
    for m in range(5):
        psi = wave_k[m] * c.depth + wave_lat[m] * c.lateral * wave_k[m] + rng.uniform(0, 2 * np.pi)
        for basis in (np.sin(psi), np.cos(psi)):
            rows.append((c.gnd * c.fade * wave_amp[m] * 0.55 * basis).reshape(-1))
            params.append(NAMED_INDEX["ripple"])
    tphase = rng.uniform(0, 2 * np.pi, texture.count)
    rows += list(sine_pairs(X, Y, texture.vectors, tphase) * np.repeat(texture.amplitudes, 2)[:, None])
    params += [len(NAMED_PARAMS) + m for m in range(texture.count) for _ in range(2)]
    return Modulated(rows, params, star_phase, wave_omega, wave_rows, Fire(fire_x, fire_base, fire_h))


@dataclass(frozen=True)
class Dynamic:
    """Images that move per frame: clouds (noise drifting sideways in the sky) and flames
    (noise rising in the fire's envelope), as sine bases."""

    cloud_k: np.ndarray  # [14, 2]
    cloud_speed: float
    cloud_rows: np.ndarray
    cloud_zone: np.ndarray
    fire_k: np.ndarray  # [10, 2]
    fire_speed: float
    fire_rows: np.ndarray
    fire_envelope: np.ndarray


def dynamic(c: Canvas, rng: np.random.Generator, fire: Fire) -> Dynamic:
    X, Y = c.X, c.Y
    nc = 14
    cloud_k = np.stack([rng.uniform(1.0, 4.0, nc) * rng.choice([-1, 1], nc), rng.uniform(2.0, 8.0, nc)], axis=1)
    cloud_speed = rng.uniform(0.06, 0.1) * rng.choice([-1, 1])
    cloud_phase = rng.uniform(0, 2 * np.pi, nc)
    cloud_amp = 1 / np.sqrt(np.abs(cloud_k[:, 0] * cloud_k[:, 1]))
    cloud_amp /= np.sqrt((cloud_amp**2).sum() / 2)
    cloud_rows = sine_pairs(X, Y, cloud_k, cloud_phase) * np.repeat(cloud_amp, 2)[:, None]
    cloud_zone = c.sky * smooth_ramp(0.12, 0.5, c.g)
    fire_k = np.stack([rng.uniform(7, 20, 10) * rng.choice([-1, 1], 10), rng.uniform(3, 10, 10)], axis=1)
    fire_speed = 0.75 * (fire.height / 0.6)
    fire_phase = rng.uniform(0, 2 * np.pi, 10)
    fire_amp = 1 / np.sqrt(np.hypot(fire_k[:, 0], fire_k[:, 1]))
    fire_amp /= np.sqrt((fire_amp**2).sum() / 2)
    fire_rows = sine_pairs(X, Y, fire_k, fire_phase) * np.repeat(fire_amp, 2)[:, None]
    fu = (fire.base - Y) / fire.height
    fire_w = 0.24 * (fire.height / 0.6) * np.clip(1 - fu, 0, 1) ** 0.7 + 1e-3
    envelope = np.exp(-(((X - fire.x) / fire_w) ** 2)) * smooth_ramp(-0.05, 0.03, fu) * np.clip(1 - fu, 0, 1) ** 0.5
    return Dynamic(cloud_k, cloud_speed, cloud_rows, cloud_zone, fire_k, fire_speed, fire_rows, envelope)


def particles(c: Canvas, rng: np.random.Generator) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Snowflakes (near ones blurred) and raindrops, wrapping around the frame: (snow, rain)."""
    bw, bh = c.bw, c.bh
    n_snow = int(150 * bw * bh) + 20
    snow = {
        "x": rng.uniform(-bw, bw, n_snow),
        "y": rng.uniform(-bh, bh, n_snow),
        "z": rng.uniform(0, 1, n_snow),
        "omega": rng.uniform(0.7, 2.0, n_snow),
        "phase": rng.uniform(0, 2 * np.pi, n_snow),
    }
    n_rain = int(120 * bw * bh) + 20
    rain = {"x": rng.uniform(-bw, bw, n_rain), "y": rng.uniform(-bh, bh, n_rain), "z": rng.uniform(0, 1, n_rain)}
    return snow, rain
