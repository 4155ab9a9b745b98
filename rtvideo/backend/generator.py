"""The generator interface the Triton backend talks to, and the built-in generator.

The built-in generator is a tiny seeded coordinate network (SIREN-like: sine
activations over (x, y, t)) whose output layer is produced from the prompt
embedding by a fixed linear hypernetwork. Because every pixel's pre-activation
is affine in the embedding and the colour map (a sigmoid) is monotone, a convex
blend of two embeddings moves every pixel monotonically from one prompt's frame
to the other's: morphs are smooth by construction. It needs no downloaded
weights (they come from a fixed seed) and renders at a reduced resolution that
is upsampled bilinearly, which keeps it far above real time on one CPU core.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F

from rtvideo.backend import catalog
from rtvideo.backend.text_encoder import EMBEDDING_DIM, PromptEncoder
from rtvideo.core.session_config import GeneratorLimits

MIX_TOLERANCE = 1e-4


class GeneratorSession(Protocol):
    """One video stream: owns its time cursor so motion carries across chunks."""

    def generate(self, mix: Mapping[str, float], num_frames: int) -> np.ndarray:
        """The next `num_frames` frames, uint8 [num_frames, H, W, 3] RGB."""
        ...

    def close(self) -> None: ...


class VideoGenerator(Protocol):
    """What the Triton backend talks to; it never sees protocol messages."""

    limits: GeneratorLimits

    def embed(self, prompt: str) -> torch.Tensor:
        """The prompt's conditioning vector (cached)."""
        ...

    def open_session(self, *, width: int, height: int, seed: int, fps: int | None = None) -> GeneratorSession: ...


def validate_mix(mix: Mapping[str, float]) -> None:
    """A mix is a convex combination: non-empty, weights >= 0, summing to 1."""
    if not mix:
        raise ValueError("mix must name at least one prompt")
    weights = list(mix.values())
    if any(not math.isfinite(w) or w < 0 for w in weights):
        raise ValueError(f"mix weights must be finite and non-negative, got {weights}")
    if abs(sum(weights) - 1.0) > MIX_TOLERANCE:
        raise ValueError(f"mix weights must sum to 1, got {sum(weights)}")


@dataclass(frozen=True)
class RendererConfig:
    """Sizes and scales of the built-in network; the defaults are tuned for speed and looks."""

    hidden: int = 48
    render_min: int = 64  # long side of the rendered grid, before bilinear upsampling ...
    render_max: int = 160
    render_divisor: int = 4  # ... is the output's long side over this, clamped to [min, max]
    spatial_scale: float = 4.0  # first-layer frequencies over the [-1, 1] long side
    temporal_scale: float = 0.5  # first-layer frequencies over time, radians per second
    drift_speed: float = 0.05  # scene drift, long-side units per second
    output_gain: float = 2.0  # std of the colour pre-activation for a unit embedding
    weight_seed: int = 20240917

    def render_size(self, width: int, height: int) -> tuple[int, int]:
        """(h, w) of the grid the network evaluates; the fields are smooth, so few samples suffice."""
        long_side = max(width, height)
        target = min(long_side, max(self.render_min, min(self.render_max, long_side // self.render_divisor)))
        scale = target / long_side
        return max(2, round(height * scale)), max(2, round(width * scale))


@dataclass(frozen=True)
class RendererWeights:
    """The global network: identical in every process because it comes from a fixed seed.

    Laid out feature-major ([hidden, pixels] activations) so every matmul has a long
    pixel dimension, which is what BLAS is fast at.
    """

    w_xy: torch.Tensor  # [hidden, 2]
    w_t: torch.Tensor  # [hidden]
    b_in: torch.Tensor  # [hidden, 1]
    w_hid: torch.Tensor  # [hidden, hidden]
    b_hid: torch.Tensor  # [hidden, 1]
    to_out: torch.Tensor  # [EMBEDDING_DIM, 3 * hidden]: embedding -> output-layer weights
    to_bias: torch.Tensor  # [EMBEDDING_DIM, 3]: embedding -> output-layer bias (dominant hue)

    @classmethod
    def from_seed(cls, config: RendererConfig, device: torch.device) -> RendererWeights:
        rng = torch.Generator().manual_seed(config.weight_seed)
        h = config.hidden

        def uniform(*shape: int, bound: float) -> torch.Tensor:
            return (torch.rand(*shape, generator=rng) * 2 - 1) * bound

        # A unit embedding gives colour pre-activations of std ~output_gain
        # (hidden features are sines with variance ~1/2).
        out_std = config.output_gain / math.sqrt(h / 2)
        tensors = dict(
            w_xy=uniform(h, 2, bound=config.spatial_scale),
            w_t=torch.randn(h, generator=rng) * config.temporal_scale,
            b_in=uniform(h, 1, bound=math.pi),
            w_hid=uniform(h, h, bound=math.sqrt(6 / h)),  # SIREN hidden-layer init
            b_hid=uniform(h, 1, bound=math.pi),
            to_out=torch.randn(EMBEDDING_DIM, 3 * h, generator=rng) * out_std,
            to_bias=torch.randn(EMBEDDING_DIM, 3, generator=rng) * (config.output_gain / 2),
        )
        return cls(**{name: t.to(device=device, dtype=torch.float32) for name, t in tensors.items()})


@dataclass
class _SessionState:
    """Per-session precomputation and the time cursor."""

    base: torch.Tensor  # [hidden, 1, pixels]: first-layer pre-activation at t = 0
    time_rate: torch.Tensor  # [hidden, 1, 1]: its change per second (phase motion + drift)
    render_size: tuple[int, int]  # (h, w) of the rendered grid
    frame_cursor: int = 0
    closed: bool = False


class BuiltinSession(GeneratorSession):
    """A stream of one scene: the seed picks its framing, phase and drift."""

    def __init__(
        self, generator: BuiltinGenerator, *, width: int, height: int, seed: int, fps: int | None = None
    ) -> None:
        problem = generator.limits.size_problem(width, height)
        if problem:
            raise ValueError(problem)
        self.width, self.height = int(width), int(height)
        self.fps = int(fps or generator.fps)  # the session's playback rate sets the motion per frame
        self._generator = generator
        self._state = self._prepare(int(seed))

    def _prepare(self, seed: int) -> _SessionState:
        gen = self._generator
        weights, device = gen.weights, gen.device
        rh, rw = gen.config.render_size(self.width, self.height)

        rng = torch.Generator().manual_seed(seed)
        angle, drift_angle = (torch.rand(2, generator=rng) * 2 * math.pi).tolist()
        offset = (torch.rand(2, 1, generator=rng) * 2 - 1) * 2
        time_offset = float(torch.rand(1, generator=rng)) * 100.0
        rotation = torch.tensor([[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]])
        drift = torch.tensor([math.cos(drift_angle), math.sin(drift_angle)]) * gen.config.drift_speed

        # Pixel centres; the long side spans [-1, 1] so the aspect ratio crops, never stretches.
        long_side = max(self.width, self.height)
        ys = ((torch.arange(rh) + 0.5) / rh * 2 - 1) * (self.height / long_side)
        xs = ((torch.arange(rw) + 0.5) / rw * 2 - 1) * (self.width / long_side)
        grid = torch.stack(torch.meshgrid(xs, ys, indexing="xy")).reshape(2, -1)  # [2, pixels], row-major
        points = (rotation @ grid + offset).to(device)

        # Position at time t is p - drift * t, so the pre-activation is affine in t.
        time_rate = weights.w_t - weights.w_xy @ drift.to(device)
        base = weights.w_xy @ points + weights.b_in + time_offset * time_rate[:, None]
        return _SessionState(base=base[:, None, :], time_rate=time_rate[:, None, None], render_size=(rh, rw))

    @torch.inference_mode()
    def generate(self, mix: Mapping[str, float], num_frames: int) -> np.ndarray:
        """The next `num_frames` frames; the cursor advances so the next chunk continues smoothly."""
        state = self._state
        if state.closed:
            raise RuntimeError("session is closed")
        if num_frames < 1:
            raise ValueError(f"num_frames must be >= 1, got {num_frames}")
        gen = self._generator
        embedding = gen.blend(mix)
        weights = gen.weights
        out_w = (embedding @ weights.to_out).view(3, -1)
        out_b = (embedding @ weights.to_bias)[:, None]

        frame_ids = torch.arange(state.frame_cursor, state.frame_cursor + num_frames, device=gen.device)
        times = (frame_ids.to(torch.float32) / self.fps)[None, :, None]
        state.frame_cursor += num_frames

        hidden = torch.sin(torch.addcmul(state.base, state.time_rate, times))  # [H, T, P]
        hidden = torch.sin(torch.addmm(weights.b_hid, weights.w_hid, hidden.view(hidden.shape[0], -1)))
        rgb = torch.sigmoid(torch.addmm(out_b, out_w, hidden))  # [3, T * P]
        rh, rw = state.render_size
        return self._to_frames(rgb.view(3, num_frames, rh, rw).transpose(0, 1))

    def _to_frames(self, rgb: torch.Tensor) -> np.ndarray:
        """[T, 3, h, w] in [0, 1] -> uint8 [T, H, W, 3], upsampled bilinearly."""
        size = (self.height, self.width)
        if rgb.device.type == "cpu":
            # Quantise first: CPU has a fast uint8 channels-last bilinear kernel (CUDA has none).
            frames = _quantise(rgb).contiguous(memory_format=torch.channels_last)
            if frames.shape[-2:] != size:
                frames = F.interpolate(frames, size=size, mode="bilinear", align_corners=False)
        else:
            frames = _quantise(F.interpolate(rgb, size=size, mode="bilinear", align_corners=False))
        return frames.permute(0, 2, 3, 1).contiguous().cpu().numpy()

    def close(self) -> None:
        """Drop the precomputed grid; later `generate` calls raise."""
        self._state.closed = True
        self._state.base = torch.empty(0)


def _quantise(rgb: torch.Tensor) -> torch.Tensor:
    """[0, 1] floats to uint8, rounding to nearest (a plain cast would truncate)."""
    return (rgb * 255 + 0.5).clamp_(0, 255).to(torch.uint8)


class BuiltinGenerator(VideoGenerator):
    """Seeded neural renderer conditioned on MiniLM prompt embeddings; CPU or CUDA."""

    limits = catalog.BUILTIN

    def __init__(self, device: str = "cpu", fps: int = 16, config: RendererConfig | None = None) -> None:
        if fps < 1:
            raise ValueError(f"fps must be >= 1, got {fps}")
        self.device = torch.device(device)
        self.fps = fps
        self.config = config or RendererConfig()
        self.weights = RendererWeights.from_seed(self.config, self.device)
        self.text_encoder = PromptEncoder(device=str(self.device))

    def embed(self, prompt: str) -> torch.Tensor:
        """The prompt's MiniLM embedding (LRU-cached by the text encoder)."""
        return self.text_encoder.encode(prompt)

    def blend(self, mix: Mapping[str, float]) -> torch.Tensor:
        """The chunk's conditioning: the exact convex blend sum(w * embed(prompt))."""
        validate_mix(mix)
        blended = torch.zeros(EMBEDDING_DIM, device=self.device)
        for prompt, weight in mix.items():
            if weight > 0:  # a finished transition may still name its old prompt
                blended += weight * self.embed(prompt)
        return blended

    def open_session(self, *, width: int, height: int, seed: int, fps: int | None = None) -> BuiltinSession:
        """A new stream; raises ValueError for sizes the encoder cannot take."""
        return BuiltinSession(self, width=width, height=height, seed=seed, fps=fps)
