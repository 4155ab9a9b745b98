"""What the built-in generator draws: a scene derived from the prompt's meaning.

A prompt's MiniLM embedding is compared (cosine) with a fixed vocabulary of concept
phrases, embedded once at start-up by the same text encoder. The similarities give
concept weights: a light (day, sunset, night, fog, storm, indoors), a ground (water,
grass, sand, snow, street, rock, floor), elements (trees, buildings, mountains, fire,
falling snow, rain, lights, a lighthouse, a vehicle, a creature) and an accent colour.
From those weights come the scene parameters: one RGB coefficient per feature image of
`SceneLayout` (sky gradient, sun, moon, stars, clouds, ground, waves, silhouettes,
flames, snowflakes, ...). A frame is the sum of the feature images weighted by their
coefficients, clipped to [0, 1].

The weights are a nonlinear function of one prompt's embedding, so they are computed
per prompt; a chunk that mixes prompts (a transition) uses the same convex mix of the
prompts' parameter matrices. Every pixel is affine in the parameters before a monotone
clip, so a transition moves every pixel monotonically from one scene to the other, and
the mix is exact (mixing the parameters of {A: 1-a, B: a} is what the chunk renders).

Geometry (horizon, sun position, tree line, skyline, where the fire or the lighthouse
stands, texture phases) comes from the session's seed and never from the prompt, so
the scene morphs in place when the prompt changes.
"""

from __future__ import annotations

import enum
import math
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from rtvideo.core.pose import Pose

# --------------------------------------------------------------------------------------
# Concept vocabulary
# --------------------------------------------------------------------------------------

#: the light of the scene; exactly one wins (softmax), with "day" as the default
LIGHTS: dict[str, tuple[str, ...]] = {
    "day": ("noon", "midday", "bright daylight", "a sunny day", "a clear blue sky", "morning"),
    "sunset": ("sunset", "sunrise", "dawn", "golden hour", "a sunset sky", "an orange evening sky"),
    "night": ("night", "at night", "midnight", "darkness", "a starry night sky", "moonlight"),
    "fog": ("fog", "mist", "haze", "an overcast grey sky"),
    "storm": ("a storm", "a thunderstorm", "lightning", "dark storm clouds"),
    "indoor": ("indoors", "inside a room", "a living room", "a sofa", "a kitchen", "a bedroom"),
}
#: what lies below the horizon; exactly one wins, "plain" (muted earth) by default
GROUNDS: dict[str, tuple[str, ...]] = {
    "water": ("the ocean", "the sea", "a lake", "waves", "a river", "a harbour", "water", "the coast"),
    "grass": ("a meadow", "green grass", "a field", "a garden", "a park"),
    "sand": ("a desert", "sand dunes", "a sandy beach"),
    "snow": ("snow", "snowy", "ice", "winter", "a frozen landscape"),
    "street": ("a street", "a road", "a city street", "pavement"),
    "rock": ("rocks", "a canyon", "a rocky landscape", "cliffs"),
    "floor": ("a wooden floor", "a carpet", "inside a room", "a living room", "a sofa"),
}
#: independent elements, each with a strength in [0, 1]
ELEMENTS: dict[str, tuple[str, ...]] = {
    "trees": ("a forest", "trees", "woods", "a jungle", "pine trees"),
    "buildings": ("a city", "buildings", "skyscrapers", "a town", "downtown"),
    "mountains": ("mountains", "a mountain range", "hills", "a volcano"),
    "fire": ("fire", "flames", "burning", "a bonfire", "lava"),
    "snowfall": ("falling snow", "snowfall", "snowflakes", "a blizzard"),
    "rain": ("rain", "rainy", "raindrops", "a rainstorm"),
    "lights": ("neon lights", "neon signs", "glowing lights", "lanterns", "street lights", "city lights"),
    "beacon": ("a lighthouse", "a tower", "a beacon"),
    "vehicle": ("a car", "a boat", "a train", "a bus"),
    "creature": ("a cat", "a dog", "an animal", "a person", "a bird"),
}
#: accent colours (display RGB); the strongest, if clearly named, tints the scene
COLOURS: dict[str, tuple[float, float, float]] = {
    "red": (0.86, 0.08, 0.06),
    "orange": (0.98, 0.45, 0.05),
    "yellow": (0.98, 0.85, 0.12),
    "green": (0.12, 0.7, 0.18),
    "blue": (0.06, 0.25, 0.9),
    "purple": (0.5, 0.12, 0.75),
    "pink": (0.98, 0.45, 0.7),
    "white": (0.95, 0.95, 0.95),
    "black": (0.03, 0.03, 0.04),
    "gold": (0.95, 0.7, 0.15),
    "brown": (0.45, 0.27, 0.12),
    "grey": (0.5, 0.5, 0.52),
}

#: how sharply a group's winner is picked (cosine units)
GROUP_TEMPERATURE = 0.025
#: a light or ground must beat the prompt's mean similarity by about this much to replace the default
DEFAULT_MARGIN = 0.09
#: element strength ramps from 0 to 1 between these margins over the prompt's mean similarity
ELEMENT_RAMP = {
    "trees": (0.10, 0.28),
    "buildings": (0.08, 0.24),
    "mountains": (0.08, 0.24),
    "fire": (0.10, 0.28),
    "snowfall": (0.10, 0.28),
    "rain": (0.10, 0.28),
    "lights": (0.10, 0.28),
    "beacon": (0.12, 0.30),
    "vehicle": (0.15, 0.35),
    "creature": (0.15, 0.35),
}
#: accent strength ramps between these margins over the mean colour similarity
ACCENT_RAMP = (0.07, 0.17)
COLOUR_TEMPERATURE = 0.02


def _smoothstep(lo: float, hi: float, x: float) -> float:
    u = min(1.0, max(0.0, (x - lo) / (hi - lo)))
    return u * u * (3 - 2 * u)


def _softmax(logits: dict[str, float], temperature: float) -> dict[str, float]:
    top = max(logits.values())
    exps = {k: math.exp((v - top) / temperature) for k, v in logits.items()}
    total = sum(exps.values())
    return {k: v / total for k, v in exps.items()}


@dataclass(frozen=True)
class SceneWeights:
    """What a prompt is about, as the renderer understands it."""

    light: dict[str, float]  # sums to 1 over LIGHTS
    ground: dict[str, float]  # sums to 1 over GROUNDS + "plain"
    elements: dict[str, float]  # each in [0, 1]
    accent: tuple[float, float, float]  # RGB
    accent_strength: float  # in [0, 1]

    def dominant(self) -> dict[str, object]:
        """A short description (for logs and tests)."""
        return {
            "light": max(self.light, key=self.light.__getitem__),
            "ground": max(self.ground, key=self.ground.__getitem__),
            "elements": sorted(k for k, v in self.elements.items() if v >= 0.5),
            "accent": round(self.accent_strength, 2),
        }


class ConceptVocabulary:
    """The concept phrases, embedded once; maps a prompt embedding to `SceneWeights`."""

    _shared: ClassVar[dict[tuple, torch.Tensor]] = {}
    _shared_lock = threading.Lock()

    def __init__(self, embed_batch: Callable[[list[str]], torch.Tensor], key: object = None) -> None:
        self.concepts: list[tuple[str, str]] = []  # (group, name), in matrix order
        phrases: list[str] = []
        owners: list[int] = []
        for group, table in (("light", LIGHTS), ("ground", GROUNDS), ("element", ELEMENTS)):
            for name, words in table.items():
                for word in words:
                    phrases.append(word)
                    owners.append(len(self.concepts))
                self.concepts.append((group, name))
        self.colour_names = list(COLOURS)
        for name in self.colour_names:
            phrases.append(name)
            owners.append(len(self.concepts))
            self.concepts.append(("colour", name))
        cache_key = (key, tuple(phrases)) if key is not None else None
        with self._shared_lock:
            matrix = self._shared.get(cache_key) if cache_key else None
        if matrix is None:
            matrix = embed_batch(phrases).detach().to(device="cpu", dtype=torch.float64)
            if cache_key:
                with self._shared_lock:
                    self._shared[cache_key] = matrix
        self._matrix = matrix.numpy()  # [phrases, 384]
        self._owners = np.asarray(owners)
        self._count = len(self.concepts)

    def scores(self, embedding: torch.Tensor) -> dict[tuple[str, str], float]:
        """Each concept's cosine similarity with the prompt: the best of its phrases."""
        sims = self._matrix @ embedding.detach().to(device="cpu", dtype=torch.float64).numpy()
        best = np.full(self._count, -np.inf)
        np.maximum.at(best, self._owners, sims)
        return {concept: float(value) for concept, value in zip(self.concepts, best, strict=True)}

    def weights(self, embedding: torch.Tensor) -> SceneWeights:
        scores = self.scores(embedding)
        scene = [v for (group, _), v in scores.items() if group != "colour"]
        mean = sum(scene) / len(scene)
        rel = {name: v - mean for (group, name), v in scores.items() if group != "colour"}
        elements = {n: _smoothstep(*ELEMENT_RAMP[n], rel[n]) for n in ELEMENTS}
        # A little scene grammar: lighthouses stand by the sea, buildings line a street, fire glows in the dark.
        light_logits = {n: rel[n] for n in LIGHTS}
        light_logits["night"] += 0.12 * elements["fire"]
        light = _softmax({**light_logits, "_default": DEFAULT_MARGIN}, GROUP_TEMPERATURE)
        light["day"] += light.pop("_default")
        # The floor of a room goes with the indoor light.
        ground_logits = {n: rel[n] for n in GROUNDS if n != "floor"}
        ground_logits["floor"] = max(rel["floor"], rel["indoor"])
        ground_logits["water"] += 0.12 * elements["beacon"]
        ground_logits["street"] += 0.08 * elements["buildings"]
        ground = _softmax({**ground_logits, "plain": DEFAULT_MARGIN}, GROUP_TEMPERATURE)
        colours = np.array([scores[("colour", n)] for n in self.colour_names])
        colour_rel = colours - colours.mean()
        exps = np.exp((colour_rel - colour_rel.max()) / COLOUR_TEMPERATURE)
        picks = exps / exps.sum()
        red, green, blue = (float(x) for x in picks @ np.array([COLOURS[n] for n in self.colour_names]))
        return SceneWeights(
            light=light,
            ground=ground,
            elements=elements,
            accent=(red, green, blue),
            accent_strength=_smoothstep(*ACCENT_RAMP, float(colour_rel.max())),
        )


# --------------------------------------------------------------------------------------
# Scene parameters: one RGB coefficient per feature image
# --------------------------------------------------------------------------------------

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


# --------------------------------------------------------------------------------------
# Layout: the feature images of one session (geometry from its seed)
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TextureBank:
    """Global texture components (same in every session): a slow, prompt-coloured mottling.

    Component m is sin(k_m . p + phase_m + omega_m t); its RGB coefficient is linear in the
    prompt embedding (`projection`), so it tells prompts apart that the vocabulary does not.
    """

    vectors: np.ndarray  # [M, 2] spatial frequencies (radians per unit)
    omegas: np.ndarray  # [M] radians per second
    amplitudes: np.ndarray  # [M]

    @classmethod
    def from_seed(cls, seed: int, count: int = 12) -> TextureBank:
        rng = np.random.default_rng([seed, 1])
        angles = rng.uniform(0, 2 * np.pi, count)
        radii = np.exp(rng.uniform(np.log(2.5), np.log(8.0), count))
        vectors = np.stack([np.cos(angles), np.sin(angles)], axis=1) * radii[:, None]
        omegas = rng.uniform(0.4, 1.0, count) * rng.choice([-1.0, 1.0], count)
        amplitudes = radii**-0.5
        return cls(vectors=vectors, omegas=omegas, amplitudes=amplitudes / np.sqrt((amplitudes**2).sum() / 2))

    @property
    def count(self) -> int:
        return len(self.omegas)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1 + np.tanh(0.5 * x))


def _sine_pairs(X: np.ndarray, Y: np.ndarray, k: np.ndarray, phase: np.ndarray) -> np.ndarray:
    """[2M, P] float32: sin and cos of k_m . (x, y) + phase_m on the grid, interleaved (sin_0, cos_0, ...)."""
    out = np.empty((2 * len(k), X.size), dtype=np.float32)
    for m in range(len(k)):
        psi = (np.float32(k[m, 0]) * X + np.float32(k[m, 1]) * Y + np.float32(phase[m])).reshape(-1)
        np.sin(psi, out=out[2 * m])
        np.cos(psi, out=out[2 * m + 1])
    return out


def _smooth(lo: float, hi: float, x: np.ndarray) -> np.ndarray:
    u = np.clip((x - lo) / (hi - lo), 0, 1)
    return u * u * (3 - 2 * u)


# --------------------------------------------------------------------------------------
# The camera: depth layers, each resampled as a camera at a pose sees it
# --------------------------------------------------------------------------------------


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
        sky = _sigmoid((H - Y) / soft)
        gnd = 1 - sky
        sky_h = hz0 + bh  # height of the sky at the centre
        g = np.clip((H - Y) / (H + bh), 0, 1)  # 0 at the horizon, 1 at the top
        d = np.clip((Y - H) / (bh - H), 0, 1)  # 0 at the horizon, 1 at the bottom
        depth = 1 / (d + 0.06)  # distance into the ground plane
        lateral = X * depth * 0.35
        fade = _smooth(0.0, 0.22, d)  # ground detail fades toward the horizon (it would alias)

        def dist(cx: float, cy: float) -> np.ndarray:
            return np.hypot(X - cx, Y - cy)

        feats: dict[str, np.ndarray] = {"sky_top": sky * g, "sky_hor": sky * (1 - g)}
        xsun = bw * rng.uniform(-0.6, 0.6)
        hsun = hz0 + tilt * xsun
        hi_y, lo_y = hsun - 0.62 * (hsun + bh), hsun - 0.07 * (hsun + bh) - 0.01
        r_sun = 0.065
        to_sun = dist(xsun, hi_y) ** 2
        feats["sun_hi_glow"] = sky * (0.55 * np.exp(-to_sun / 0.03) + 0.45 * np.exp(-to_sun / 0.35))
        feats["sun_hi_disk"] = sky * _sigmoid((r_sun - dist(xsun, hi_y)) / soft)
        ell = ((X - xsun) / 1.1) ** 2 + ((Y - lo_y) / 0.3) ** 2
        feats["sun_lo_glow"] = sky * (0.5 * np.exp(-(dist(xsun, lo_y) ** 2) / 0.02) + 0.5 * np.exp(-ell))
        feats["sun_lo_disk"] = sky * _sigmoid((1.3 * r_sun - dist(xsun, lo_y)) / soft)
        xmoon = -np.sign(xsun) * bw * rng.uniform(0.2, 0.65)
        ymoon = hz0 + tilt * xmoon - 0.72 * (hz0 + tilt * xmoon + bh)
        feats["moon_glow"] = sky * np.exp(-(dist(xmoon, ymoon) ** 2) / 0.06)
        feats["moon_disk"] = (
            sky
            * _sigmoid((0.045 - dist(xmoon, ymoon)) / soft)
            * (1 - 0.25 * _sigmoid((0.03 - dist(xmoon + 0.012, ymoon - 0.008)) / soft))
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
        dashes = _sigmoid(np.sin(depth * 3.0) / 0.2)
        markings = np.exp(-((lane / line_w) ** 2)) * dashes + np.exp(-(((np.abs(lane) - 1.6) / line_w) ** 2))
        feats["road"] = gnd * _smooth(0.02, 0.12, d) * markings
        feats["reflect_lo"] = gnd * np.exp(-(((X - xsun) / (0.03 + 0.25 * d)) ** 2)) * (1 - d) ** 1.5
        feats["reflect_hi"] = gnd * np.exp(-(((X - xsun) / (0.05 + 0.2 * d)) ** 2)) * (1 - d) ** 2

        # Silhouettes standing on the horizon: pines, a skyline, a mountain range.
        def standing(profile: np.ndarray) -> np.ndarray:
            return sky * _sigmoid((Y - (H - profile)) / soft)

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
        feats["caps"] = feats["mountains"] * _sigmoid(((H - 0.3 * sky_h) - Y) / soft)
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
        inside = _sigmoid((half - np.abs(X - xt)) / soft) * _sigmoid(u / 0.01) * _sigmoid((1 - u) / 0.01)
        cap = (
            _sigmoid((0.035 - np.abs(X - xt)) / soft) * _sigmoid((Y - (top - 0.07)) / soft) * _sigmoid((top - Y) / soft)
        )
        feats["tower"] = np.maximum(inside, cap)
        feats["tower_stripes"] = inside * _sigmoid(np.sin(u * 2 * np.pi * 2.5) / 0.15) * (u < 0.85)
        feats["tower_shade"] = feats["tower"] * np.clip((X - xt) / 0.06, 0, 1)
        ly = top - 0.035
        feats["lamp"] = np.exp(-((dist(xt, ly) / 0.03) ** 2)) + 0.35 * np.exp(-((dist(xt, ly) / 0.12) ** 2))
        dx, dy = X - xt, Y - ly
        beam = (
            np.exp(-((dy / (0.012 + 0.1 * np.abs(dx))) ** 2))
            * np.exp(-np.abs(dx) / 1.6)
            * _smooth(0.0, 0.05, np.abs(dx))
        )

        # A subject in the foreground: a car, or a sleeping cat.
        xs_ = bw * rng.uniform(-0.35, 0.35)
        ys_ = hz0 + tilt * xs_ + 0.55 * (bh - hz0 - tilt * xs_)
        sc = 0.7 + 0.4 * rng.random()
        edge = soft / (0.06 * sc)

        def blob(cx: float, cy: float, rx: float, ry: float, power: float = 2.0) -> np.ndarray:
            level = np.abs((X - cx) / (rx * sc)) ** power + np.abs((Y - cy) / (ry * sc)) ** power
            return _sigmoid((1 - level) / edge)

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
            ears += _sigmoid((0.55 * (Y - etop) - np.abs(X - ecx)) / soft) * _sigmoid((ys_ - 0.085 * sc - Y) / soft)
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
        star_zone = (sky * _smooth(0.25, 0.45, g)).reshape(-1)
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
        mod_rows += list(_sine_pairs(X, Y, texture.vectors, tphase) * np.repeat(texture.amplitudes, 2)[:, None])
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
        cloud_rows = _sine_pairs(X, Y, self._cloud_k, cloud_phase) * np.repeat(cloud_amp, 2)[:, None]
        self._cloud_zone = sky * _smooth(0.12, 0.5, g)
        self._fire_k = np.stack([rng.uniform(7, 20, 10) * rng.choice([-1, 1], 10), rng.uniform(3, 10, 10)], axis=1)
        self._fire_speed = 0.75 * (fire_h / 0.6)
        fire_phase = rng.uniform(0, 2 * np.pi, 10)
        fire_amp = 1 / np.sqrt(np.hypot(self._fire_k[:, 0], self._fire_k[:, 1]))
        fire_amp /= np.sqrt((fire_amp**2).sum() / 2)
        fire_rows = _sine_pairs(X, Y, self._fire_k, fire_phase) * np.repeat(fire_amp, 2)[:, None]
        fu = (fire_base - Y) / fire_h
        fire_w = 0.24 * (fire_h / 0.6) * np.clip(1 - fu, 0, 1) ** 0.7 + 1e-3
        self._fire_envelope = (
            np.exp(-(((X - fire_x) / fire_w) ** 2)) * _smooth(-0.05, 0.03, fu) * np.clip(1 - fu, 0, 1) ** 0.5
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
