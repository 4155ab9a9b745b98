"""The built-in scene's sections, one by one (rtvideo/backend/builtin/scene/features.py)."""

from __future__ import annotations

import numpy as np

from rtvideo.backend.builtin.scene import features
from rtvideo.backend.builtin.scene.parameters import STATIC_FEATURES
from rtvideo.backend.builtin.scene.textures import TextureBank


def make(seed: int = 3) -> tuple[features.Canvas, np.random.Generator]:
    rng = np.random.default_rng(seed)
    return features.canvas(640, 384, (48, 80), rng), rng


def test_the_canvas_spans_the_long_side_and_splits_sky_from_ground() -> None:
    c, _ = make()
    assert c.X.shape == c.Y.shape == (48, 80) and (c.bw, c.bh) == (1.0, 0.6)
    assert np.allclose(c.sky + c.gnd, 1) and abs(c.hz0) <= 0.35 * c.bh
    assert c.sky[0].mean() > 0.99 and c.gnd[-1].mean() > 0.99  # sky on top, ground below


def test_each_section_adds_the_features_it_names() -> None:
    c, rng = make()
    feats: features.Features = {}
    xsun = features.sky_and_ground(c, rng, feats)
    assert abs(xsun) <= 0.6 * c.bw and {"sky_top", "sun_lo_disk", "road", "reflect_hi"} <= set(feats)
    features.silhouettes(c, rng, feats)
    assert {"trees", "buildings", "windows_a", "mountains_lo_glow", "lanterns"} <= set(feats)
    beam, dx = features.lighthouse(c, rng, feats, xsun)
    assert beam.shape == dx.shape == c.X.shape and {"tower", "lamp"} <= set(feats)
    features.subject(c, rng, feats)
    assert set(STATIC_FEATURES) <= set(feats)
    assert all(np.isfinite(v).all() for v in feats.values())
    texture = TextureBank.from_seed(1)
    mod = features.modulated(c, rng, beam, dx, texture)
    assert len(mod.rows) == len(mod.params) == 5 + 10 + 2 * texture.count
    assert mod.wave_rows == slice(5, 15)
    dyn = features.dynamic(c, rng, mod.fire)
    assert dyn.fire_envelope.shape == c.X.shape and dyn.cloud_rows.shape[0] == 28
    snow, rain = features.particles(c, rng)
    assert len(snow["x"]) == int(150 * c.bw * c.bh) + 20 and len(rain["x"]) == int(120 * c.bw * c.bh) + 20


def test_the_same_seed_gives_the_same_sections() -> None:
    (c1, r1), (c2, r2) = make(9), make(9)
    f1: features.Features = {}
    f2: features.Features = {}
    assert features.sky_and_ground(c1, r1, f1) == features.sky_and_ground(c2, r2, f2)
    assert all(np.array_equal(f1[k], f2[k]) for k in f1)
