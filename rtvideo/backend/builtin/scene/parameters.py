"""Scene parameters: one RGB coefficient per feature image of the layout, from `SceneWeights`."""

from __future__ import annotations

import numpy as np

from rtvideo.backend.builtin.scene.concepts import SceneWeights

#: feature images that do not change over time
STATIC_FEATURES = (
    "sky_top",
    "sky_hor",
    "sun_hi_glow",
    "sun_hi_disk",
    "sun_lo_glow",
    "sun_lo_disk",
    "moon_glow",
    "moon_disk",
    "haze",
    "vignette",
    "gnd_far",
    "gnd_near",
    "gnd_tex",
    "dunes",
    "planks",
    "road",
    "reflect_lo",
    "reflect_hi",
    "trees",
    "buildings",
    "mountains",
    "caps",
    "windows_a",
    "windows_b",
    "lanterns",
    # where silhouettes overlap each other or hide the low sun (products of masks, exact occlusion)
    "trees_buildings",
    "trees_mountains",
    "buildings_mountains",
    "trees_lo_glow",
    "trees_lo_disk",
    "buildings_lo_glow",
    "buildings_lo_disk",
    "mountains_lo_glow",
    "mountains_lo_disk",
    "tower",
    "tower_stripes",
    "tower_shade",
    "lamp",
    "vehicle",
    "vehicle_glass",
    "wheels",
    "creature",
    "ears",
    "subject_top",
    "subject_shadow",
)
#: feature images multiplied by a function of time (twinkle, sweep, flicker, waves); params shared per group
MODULATED_PARAMS = ("stars", "beam", "fire_glow", "ripple")
#: feature images computed per frame (shaped noise, particles)
DYNAMIC_FEATURES = ("clouds", "glint_lo", "glint_hi", "flames", "flame_core", "snowfall", "rain")
#: the named parameter columns; the texture columns (one per texture component) follow them
NAMED_PARAMS = STATIC_FEATURES + MODULATED_PARAMS + DYNAMIC_FEATURES
NAMED_INDEX = {name: i for i, name in enumerate(NAMED_PARAMS)}


def _v(*rgb: float) -> np.ndarray:
    return np.array(rgb, dtype=np.float64)


_ZERO = _v(0, 0, 0)
#: per light: sky at the top, sky at the horizon, ground light (multiplies ground colours)
SKY_TOP = {
    "day": _v(0.2, 0.43, 0.85),
    "sunset": _v(0.2, 0.16, 0.42),
    "night": _v(0.008, 0.012, 0.045),
    "fog": _v(0.6, 0.62, 0.64),
    "storm": _v(0.12, 0.13, 0.17),
    "indoor": _v(0.5, 0.4, 0.32),
}
SKY_HOR = {
    "day": _v(0.66, 0.8, 0.95),
    "sunset": _v(1.0, 0.52, 0.2),
    "night": _v(0.04, 0.06, 0.16),
    "fog": _v(0.8, 0.81, 0.82),
    "storm": _v(0.3, 0.32, 0.37),
    "indoor": _v(0.76, 0.62, 0.46),
}
AMBIENT = {
    "day": _v(1.0, 1.0, 1.0),
    "sunset": _v(0.85, 0.6, 0.48),
    "night": _v(0.19, 0.21, 0.33),
    "fog": _v(0.72, 0.74, 0.78),
    "storm": _v(0.4, 0.42, 0.48),
    "indoor": _v(0.9, 0.74, 0.58),
}
SUN_HI_GLOW = {"day": _v(0.3, 0.27, 0.18), "fog": _v(0.12, 0.12, 0.1), "indoor": _v(0.4, 0.28, 0.12)}
SUN_HI_DISK = {"day": _v(0.7, 0.62, 0.45), "fog": _v(0.18, 0.18, 0.15), "indoor": _v(0.5, 0.42, 0.25)}
SUN_LO_GLOW = {"sunset": _v(0.75, 0.4, 0.1)}
SUN_LO_DISK = {"sunset": _v(0.6, 0.5, 0.35)}
CLOUDS = {
    "day": _v(0.32, 0.32, 0.3),
    "sunset": _v(0.45, 0.18, 0.25),
    "night": _v(0.05, 0.06, 0.09),
    "fog": _v(0.06, 0.06, 0.06),
    "storm": _v(-0.09, -0.09, -0.07),
}
HAZE = {
    "day": _v(0.08, 0.09, 0.1),
    "sunset": _v(0.14, 0.08, 0.05),
    "night": _v(0.015, 0.02, 0.035),
    "fog": _v(0.42, 0.43, 0.44),
    "storm": _v(0.1, 0.1, 0.12),
}
#: how dark it is (lamps, windows, beams and fire show more in the dark)
DARKNESS = {"day": 0.0, "sunset": 0.5, "night": 1.0, "fog": 0.35, "storm": 0.75, "indoor": 0.3}
#: per ground: far colour, near colour, fine texture, dunes, planks, road markings (before the light)
GROUND_FAR = {
    "water": _v(0.04, 0.2, 0.36),
    "grass": _v(0.38, 0.55, 0.24),
    "sand": _v(0.93, 0.8, 0.58),
    "snow": _v(0.86, 0.89, 0.95),
    "street": _v(0.42, 0.42, 0.45),
    "rock": _v(0.64, 0.45, 0.33),
    "floor": _v(0.56, 0.37, 0.22),
    "plain": _v(0.5, 0.5, 0.38),
}
GROUND_NEAR = {
    "water": _v(0.02, 0.09, 0.22),
    "grass": _v(0.15, 0.38, 0.08),
    "sand": _v(0.84, 0.65, 0.4),
    "snow": _v(0.97, 0.98, 1.0),
    "street": _v(0.19, 0.19, 0.21),
    "rock": _v(0.5, 0.32, 0.2),
    "floor": _v(0.4, 0.23, 0.11),
    "plain": _v(0.32, 0.32, 0.2),
}
GROUND_TEX = {"grass": 0.16, "sand": 0.06, "snow": 0.05, "street": 0.05, "rock": 0.16, "floor": 0.05, "plain": 0.1}
GROUND_DUNES = {"sand": 0.2, "rock": 0.08, "snow": 0.06}
GROUND_PLANKS = {"floor": 0.14}
GROUND_ROAD = {"street": 0.55}
WARM_LIGHT = _v(1.0, 0.75, 0.38)


def _lum(rgb: np.ndarray) -> float:
    return float(rgb @ _v(0.2126, 0.7152, 0.0722))


def scene_parameters(w: SceneWeights) -> np.ndarray:
    """[3, len(NAMED_PARAMS)]: the RGB coefficient of every named feature image for one prompt.

    Nonlinear in the weights (occlusion and light are products), which is why a mix of
    prompts mixes these matrices rather than the embeddings.
    """
    L, G, E = w.light, w.ground, w.elements

    def over(table: dict[str, np.ndarray], weights: dict[str, float]) -> np.ndarray:
        return sum((weights.get(k, 0.0) * v for k, v in table.items()), _ZERO.copy())

    accent = np.asarray(w.accent)
    # A named colour tints the scene, less so when it belongs to a subject ("a red car").
    subject = max(E["vehicle"], E["creature"], E["beacon"])
    tint = 0.2 * w.accent_strength * (1 - 0.75 * subject)

    def tinted(rgb: np.ndarray, amount: float = tint) -> np.ndarray:
        """Pull a colour toward the accent at the same brightness."""
        target = accent * (_lum(rgb) / max(_lum(accent), 0.12))
        return (1 - amount) * rgb + amount * np.clip(target, 0.0, 1.2)

    amb = over(AMBIENT, L)
    dark = sum(L[k] * DARKNESS[k] for k in L)
    bright = _lum(amb)
    top, hor = tinted(over(SKY_TOP, L), 0.5 * tint), tinted(over(SKY_HOR, L), 0.5 * tint)
    p: dict[str, np.ndarray] = {"sky_top": top, "sky_hor": hor}
    sharp = {k: v * v for k, v in L.items()}  # a disk shows only for a clear winner
    p["sun_hi_glow"], p["sun_hi_disk"] = over(SUN_HI_GLOW, L), over(SUN_HI_DISK, sharp)
    p["sun_lo_glow"], p["sun_lo_disk"] = over(SUN_LO_GLOW, L), over(SUN_LO_DISK, sharp)
    p["moon_glow"], p["moon_disk"] = L["night"] * _v(0.08, 0.1, 0.18), sharp["night"] * _v(0.85, 0.86, 0.8)
    p["stars"] = L["night"] * (1 - 0.9 * min(1.0, E["snowfall"] + E["rain"])) * _v(0.75, 0.75, 0.85)
    p["clouds"] = over(CLOUDS, L) * (1 + 0.6 * E["rain"])
    p["haze"] = over(HAZE, L)

    # Ground: its colours lit by the light; trees darken it to a forest floor unless snow covers it.
    def ground(table: dict[str, np.ndarray]) -> np.ndarray:
        return over(table, G) * amb

    far, near = ground(GROUND_FAR), ground(GROUND_NEAR)
    snow_light = np.maximum(amb, _v(0.36, 0.42, 0.58)) - amb  # snow stays pale in the dark
    far, near = far + G["snow"] * GROUND_FAR["snow"] * snow_light, near + G["snow"] * GROUND_NEAR["snow"] * snow_light
    far = far + G["water"] * (0.6 * hor - 0.6 * GROUND_FAR["water"] * amb)  # water mirrors the sky
    forest = 0.55 * E["trees"] * (1 - G["snow"])
    far = (1 - forest) * far + forest * _v(0.1, 0.22, 0.08) * amb
    near = (1 - forest) * near + forest * _v(0.06, 0.16, 0.05) * amb
    far, near = tinted(far), tinted(near)
    p["gnd_far"], p["gnd_near"] = far, near
    mid = 0.5 * (far + near)
    p["gnd_tex"] = sum(G.get(k, 0.0) * a for k, a in GROUND_TEX.items()) * (mid + 0.05)
    p["dunes"] = sum(G.get(k, 0.0) * a for k, a in GROUND_DUNES.items()) * (mid + 0.05)
    p["planks"] = sum(G.get(k, 0.0) * a for k, a in GROUND_PLANKS.items()) * (mid + 0.05)
    p["road"] = sum(G.get(k, 0.0) * a for k, a in GROUND_ROAD.items()) * _v(0.9, 0.85, 0.6) * (0.3 + 0.7 * bright)
    sun_lo = p["sun_lo_glow"] + p["sun_lo_disk"]
    sun_hi = p["sun_hi_glow"] + p["sun_hi_disk"] + 0.5 * p["moon_disk"]
    p["reflect_lo"] = G["water"] * 0.45 * sun_lo
    p["reflect_hi"] = G["water"] * 0.25 * sun_hi
    p["ripple"] = G["water"] * 0.5 * (0.35 * hor + 0.15 * amb)
    p["glint_lo"] = G["water"] * 1.2 * sun_lo
    p["glint_hi"] = G["water"] * 0.9 * sun_hi

    # Silhouettes: each replaces the sky behind it (an estimate of it), at its strength.
    s_trees, s_bld = E["trees"], E["buildings"]
    s_mtn = min(1.0, E["mountains"] + 0.35 * G["snow"] + 0.4 * G["rock"])
    trees_rgb = (1 - 0.45 * G["snow"]) * _v(0.04, 0.12, 0.06) * amb + 0.45 * G["snow"] * _v(0.6, 0.66, 0.7) * amb
    bld_rgb = _v(0.2, 0.21, 0.25) * (0.25 + 0.75 * amb)
    mtn_rgb = 0.4 * hor + 0.6 * tinted(_v(0.32, 0.33, 0.42)) * amb
    low_sky = 0.85 * hor + 0.15 * top
    p["trees"] = s_trees * (trees_rgb - low_sky)
    p["buildings"] = s_bld * (bld_rgb - (0.7 * hor + 0.3 * top))
    p["mountains"] = s_mtn * (mtn_rgb - (0.6 * hor + 0.4 * top))
    p["caps"] = s_mtn * (0.25 + 0.75 * G["snow"]) * (_v(0.92, 0.94, 0.98) * amb - mtn_rgb)
    # Overlaps: trees stand before buildings, both before mountains.
    p["trees_buildings"] = -s_trees * p["buildings"]
    p["trees_mountains"] = -s_trees * p["mountains"]
    p["buildings_mountains"] = -s_bld * p["mountains"]
    for name, strength in (("trees", s_trees), ("buildings", s_bld), ("mountains", s_mtn)):
        p[f"{name}_lo_glow"] = -strength * p["sun_lo_glow"]
        p[f"{name}_lo_disk"] = -strength * p["sun_lo_disk"]
    lights = E["lights"]
    lit = min(1.0, dark + 0.15 + lights)
    neon = lights * max(L["night"], L["storm"], 0.5 * L["sunset"])
    p["windows_a"] = s_bld * (lit * (1 - neon) * WARM_LIGHT * 0.9 + neon * _v(0.95, 0.2, 0.75))
    p["windows_b"] = s_bld * (lit * (1 - neon) * WARM_LIGHT * 0.75 + neon * _v(0.15, 0.85, 0.95))
    p["lanterns"] = lights * (0.35 + 0.65 * dark) * WARM_LIGHT
    p["haze"] = p["haze"] + s_bld * dark * (0.4 + 0.6 * lights) * _v(0.12, 0.08, 0.12)  # a city glows at night

    # A lighthouse (or tower): white with red bands, or the accent colour with white bands.
    s_tw = E["beacon"]
    a = w.accent_strength
    body = (1 - a) * _v(0.9, 0.9, 0.87) + a * accent
    bands = (1 - a) * _v(0.8, 0.1, 0.08) + a * _v(0.93, 0.93, 0.9)
    tall_sky = 0.5 * hor + 0.5 * top
    p["tower"] = s_tw * (body * (0.2 + 0.8 * amb) - tall_sky)
    p["tower_stripes"] = s_tw * (bands - body) * (0.2 + 0.8 * amb)
    p["tower_shade"] = -0.45 * s_tw * body * (0.2 + 0.8 * amb)
    p["lamp"] = s_tw * (0.35 + 0.65 * dark) * _v(1.0, 0.93, 0.7)
    p["beam"] = s_tw * (0.08 + 0.5 * dark) * _v(1.0, 0.95, 0.75)

    # A vehicle or creature in the foreground, in the accent colour when one is named.
    s_car, s_pet = E["vehicle"], E["creature"] * (1 - E["vehicle"])
    shade = 0.25 + 0.75 * amb
    ground_there = 0.55 * far + 0.45 * near
    car_rgb = ((1 - a) * _v(0.6, 0.62, 0.66) + a * accent) * shade
    pet_rgb = ((1 - a) * _v(0.78, 0.46, 0.2) + a * accent) * shade
    p["vehicle"] = s_car * (car_rgb - ground_there)
    p["vehicle_glass"] = s_car * (_v(0.12, 0.16, 0.22) * shade + 0.25 * hor - car_rgb)
    p["wheels"] = s_car * (_v(0.04, 0.04, 0.05) - ground_there)
    p["creature"] = s_pet * (pet_rgb - ground_there)
    p["ears"] = s_pet * (pet_rgb - (0.6 * hor + 0.4 * far))
    p["subject_top"] = (s_car + s_pet) * 0.22 * (0.3 + 0.7 * amb)
    p["subject_shadow"] = -0.6 * (s_car + s_pet) * ground_there

    fire = E["fire"]
    p["flames"] = fire * ((1 - 0.4 * a) * _v(1.0, 0.42, 0.06) + 0.4 * a * accent)
    p["flame_core"] = fire * _v(0.55, 0.5, 0.3)
    p["fire_glow"] = fire * (0.45 + 0.55 * dark) * _v(0.8, 0.26, 0.04)
    p["snowfall"] = E["snowfall"] * (0.35 + 0.65 * bright) * _v(0.95, 0.96, 1.0)
    p["rain"] = min(1.0, E["rain"] + 0.6 * L["storm"]) * (0.25 + 0.5 * bright) * _v(0.7, 0.75, 0.85)
    p["vignette"] = -0.22 * (0.3 * _lum(hor) + 0.2 * _lum(far) + 0.1) * _v(1, 1, 1)

    out = np.zeros((3, len(NAMED_PARAMS)))
    for name, rgb in p.items():
        out[:, NAMED_INDEX[name]] = rgb
    return out
