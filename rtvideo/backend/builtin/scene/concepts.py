"""Concept vocabulary: a prompt embedding to `SceneWeights` (light, ground, elements, accent)."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

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
