"""The generator interface the Triton backend talks to, and the built-in generator.

The built-in generator draws a scene that follows the prompt's meaning without any
downloaded weights: the prompt's MiniLM embedding is compared with a fixed vocabulary
of concept phrases (embedded once at start-up), which picks the light, the ground and
the elements of the scene, its palette and an accent colour (`rtvideo.backend.builtin.scene`).
Those become one RGB coefficient per feature image (sky, sun, clouds, water, trees,
flames, snowflakes, ...); the session's seed fixes the geometry. A chunk that mixes
prompts (a transition, a blend) mixes their coefficient matrices with the mix weights, and
every pixel is affine in the coefficients before a clip, so a linear transition moves every
pixel monotonically from one scene to the other and a 50/50 blend shows both halfway. A
recipe with slerp (`rtvideo.core.conditioning`) resolves to coefficients over its prompts
(`builtin.conditioning.resolve`) whose sum may exceed 1: the named scene parameters take them
normalised (a convex mix, as above), the embedding-driven texture takes them as they are, so
the conditioning's norm (slerp keeps it, a linear blend shrinks it) shows in the texture. Rendering is a few small matrix products
at a reduced resolution, upsampled bilinearly: far above real time on one CPU core.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from rtvideo.backend import catalog
from rtvideo.backend.builtin import conditioning as resolved
from rtvideo.backend.builtin.scene.camera import is_start_pose
from rtvideo.backend.builtin.scene.concepts import ConceptVocabulary, SceneWeights
from rtvideo.backend.builtin.scene.layout import SceneLayout
from rtvideo.backend.builtin.scene.parameters import scene_parameters
from rtvideo.backend.builtin.scene.textures import TextureBank
from rtvideo.backend.builtin.text_encoder import EMBEDDING_DIM, PromptEncoder
from rtvideo.backend.runtime.ports import GeneratorSession, VideoGenerator
from rtvideo.core.conditioning import Conditioning, Interp
from rtvideo.core.pose import Pose

MIX_TOLERANCE = 1e-4


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
    """Sizes and scales of the built-in renderer; the defaults are tuned for speed and looks."""

    render_min: int = 64  # long side of the rendered grid, before bilinear upsampling ...
    render_max: int = 320
    render_divisor: int = 2  # ... is the output's long side over this, clamped to [min, max]
    texture_components: int = 12  # prompt-coloured mottling (see TextureBank)
    texture_gain: float = 0.018  # its strength for a unit embedding
    weight_seed: int = 20240917
    params_cache_size: int = 1024  # prompts whose scene parameters are kept

    def render_size(self, width: int, height: int) -> tuple[int, int]:
        """(h, w) of the grid the scene is evaluated on; the fields are smooth, so few samples suffice."""
        long_side = max(width, height)
        target = min(long_side, max(self.render_min, min(self.render_max, long_side // self.render_divisor)))
        scale = target / long_side
        return max(2, round(height * scale)), max(2, round(width * scale))


@dataclass(frozen=True)
class RendererWeights:
    """The global weights: identical in every process because they come from a fixed seed."""

    texture_vectors: torch.Tensor  # [M, 2] spatial frequencies of the texture components
    texture_omegas: torch.Tensor  # [M] their temporal frequencies
    texture_amplitudes: torch.Tensor  # [M]
    texture_projection: torch.Tensor  # [EMBEDDING_DIM, 3 * M]: embedding -> texture RGB coefficients

    @classmethod
    def from_seed(cls, config: RendererConfig, device: torch.device) -> RendererWeights:
        bank = TextureBank.from_seed(config.weight_seed, config.texture_components)
        rng = torch.Generator().manual_seed(config.weight_seed)
        projection = torch.randn(EMBEDDING_DIM, 3 * bank.count, generator=rng) * config.texture_gain
        return cls(
            texture_vectors=torch.from_numpy(bank.vectors),
            texture_omegas=torch.from_numpy(bank.omegas),
            texture_amplitudes=torch.from_numpy(bank.amplitudes),
            texture_projection=projection.to(device=device, dtype=torch.float32),
        )

    def texture_bank(self) -> TextureBank:
        return TextureBank(
            vectors=self.texture_vectors.numpy(),
            omegas=self.texture_omegas.numpy(),
            amplitudes=self.texture_amplitudes.numpy(),
        )


@dataclass
class _SessionState:
    """Per-session feature images (built by the first `generate`) and the time cursor."""

    seed: int
    layout: SceneLayout | None = None
    frame_cursor: int = 0
    closed: bool = False
    image: np.ndarray | None = None  # the reference image, until the first chunk has shown it


class BuiltinSession(GeneratorSession):
    """A stream of one scene: the seed picks its geometry (horizon, sun, skyline, ...) and phases."""

    def __init__(
        self,
        generator: BuiltinGenerator,
        *,
        width: int,
        height: int,
        seed: int,
        fps: int | None = None,
        image: np.ndarray | None = None,
    ) -> None:
        problem = generator.limits.size_problem(width, height)
        if problem:
            raise ValueError(problem)
        if image is not None and (image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8):
            raise ValueError(f"image must be uint8 RGB [H, W, 3], not {image.dtype} {image.shape}")
        self.width, self.height = int(width), int(height)
        self.fps = int(fps or generator.fps)  # the session's playback rate sets the motion per frame
        self._generator = generator
        self._state = _SessionState(seed=int(seed), image=image)

    def _layout(self) -> SceneLayout:
        """The session's feature images: built on the session's own thread by the first chunk
        (tens of milliseconds), so that opening a session on the request path stays instant."""
        state = self._state
        if state.layout is None:
            gen = self._generator
            state.layout = SceneLayout(
                width=self.width,
                height=self.height,
                render_size=gen.config.render_size(self.width, self.height),
                seed=state.seed,
                texture=gen.texture,
                device=gen.device,
            )
        return state.layout

    @torch.inference_mode()
    def generate(self, mix: Conditioning, num_frames: int, poses: Sequence[Pose] | None = None) -> np.ndarray:
        """The next `num_frames` frames; the cursor advances so the next chunk continues smoothly.
        `poses` (one per frame, or None for the start pose throughout) place the camera
        (`SceneLayout.render`); start poses render exactly the frames of a fixed camera."""
        state = self._state
        if state.closed:
            raise RuntimeError("session is closed")
        if num_frames < 1:
            raise ValueError(f"num_frames must be >= 1, got {num_frames}")
        if poses is not None and len(poses) != num_frames:
            raise ValueError(f"poses must give one pose per frame: {len(poses)} for {num_frames} frames")
        params = self._generator.scene_parameters(mix)
        times = np.arange(state.frame_cursor, state.frame_cursor + num_frames, dtype=np.float64) / self.fps
        state.frame_cursor += num_frames
        moving = poses is not None and not all(is_start_pose(pose) for pose in poses)
        frames = self._to_frames(self._layout().render(params, times, list(poses) if moving and poses else None))
        if state.image is not None:
            frames = self._from_image(frames, state.image)
            state.image = None
        return frames

    def skip(self, num_frames: int) -> None:
        """Move the time cursor over `num_frames` frames without rendering them (a rebuild):
        the next chunk is the one a session that rendered them would show. The cursor and the
        reference image (shown only by the first chunk) are all the state a chunk leaves."""
        state = self._state
        if state.closed:
            raise RuntimeError("session is closed")
        if num_frames < 0:
            raise ValueError(f"num_frames must be >= 0, got {num_frames}")
        if num_frames:
            state.frame_cursor += num_frames
            state.image = None

    def _from_image(self, frames: np.ndarray, image: np.ndarray) -> np.ndarray:
        """The first chunk with a reference image: its first frame is the image (resized to the
        session's size), and the scene takes over linearly by the chunk's last frame."""
        from rtvideo.backend.media.image_reference import resize_image

        still = resize_image(image, self.width, self.height).astype(np.float32)
        count = len(frames)
        out = np.empty_like(frames)
        for k in range(count):
            scene_weight = k / (count - 1) if count > 1 else 0.0
            out[k] = np.clip(
                (1 - scene_weight) * still + scene_weight * frames[k].astype(np.float32) + 0.5, 0, 255
            ).astype(np.uint8)
        return out

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
        """Drop the feature images; later `generate` calls raise."""
        self._state.closed = True
        self._state.layout = None


def _quantise(rgb: torch.Tensor) -> torch.Tensor:
    """[0, 1] floats to uint8, rounding to nearest (a plain cast would truncate)."""
    return (rgb * 255 + 0.5).clamp_(0, 255).to(torch.uint8)


class BuiltinGenerator(VideoGenerator):
    """Prompt-following scene renderer conditioned on MiniLM prompt embeddings; CPU or CUDA."""

    limits = catalog.BUILTIN

    def __init__(self, device: str = "cpu", fps: int = 16, config: RendererConfig | None = None) -> None:
        if fps < 1:
            raise ValueError(f"fps must be >= 1, got {fps}")
        self.device = torch.device(device)
        self.fps = fps
        self.config = config or RendererConfig()
        self.weights = RendererWeights.from_seed(self.config, self.device)
        self.texture = self.weights.texture_bank()
        self.text_encoder = PromptEncoder(device=str(self.device))
        self.vocabulary = ConceptVocabulary(self.text_encoder.encode_batch, key="all-MiniLM-L6-v2")
        self._params: OrderedDict[str, torch.Tensor] = OrderedDict()
        self._params_lock = threading.Lock()

    def embed(self, prompt: str) -> torch.Tensor:
        """The prompt's MiniLM embedding (LRU-cached by the text encoder)."""
        return self.text_encoder.encode(prompt)

    def blend(self, mix: Conditioning) -> torch.Tensor:
        """The conditioning's embedding: sum(c * embed(prompt)) over its coefficients (a mix: the
        exact convex blend of the prompts' embeddings)."""
        blended = torch.zeros(EMBEDDING_DIM, device=self.device)
        for prompt, weight in self.coefficients(mix).items():
            if weight > 0:  # a finished transition may still name its old prompt
                blended += weight * self.embed(prompt)
        return blended

    def coefficients(self, mix: Conditioning) -> dict[str, float]:
        """A mix as it is (validated); a recipe with slerp resolved against the embeddings."""
        if not isinstance(mix, Interp):
            validate_mix(mix)
            return dict(mix)
        return resolved.resolve(mix, lambda prompt: self.embed(prompt).cpu().numpy())

    def scene_weights(self, prompt: str) -> SceneWeights:
        """What the renderer understands of `prompt` (light, ground, elements, accent)."""
        return self.vocabulary.weights(self.embed(prompt))

    def prompt_parameters(self, prompt: str) -> torch.Tensor:
        """[3, K]: the scene coefficients of one prompt (cached; a fresh copy)."""
        with self._params_lock:
            cached = self._params.get(prompt)
            if cached is not None:
                self._params.move_to_end(prompt)
                return cached.clone()
        embedding = self.embed(prompt)
        named = torch.from_numpy(scene_parameters(self.vocabulary.weights(embedding)))
        texture = (embedding @ self.weights.texture_projection).view(3, -1)
        params = torch.cat([named.to(device=self.device, dtype=torch.float32), texture], dim=1)
        with self._params_lock:
            self._params[prompt] = params
            while len(self._params) > self.config.params_cache_size:
                self._params.popitem(last=False)
        return params.clone()

    def scene_parameters(self, mix: Conditioning) -> torch.Tensor:
        """The chunk's coefficients: for a mix the exact convex mix sum(w * prompt_parameters(prompt));
        for a recipe the named part mixed with its coefficients normalised, the texture with them
        as they are (the module docstring)."""
        weights = self.coefficients(mix)
        total = sum(weights.values()) if isinstance(mix, Interp) else 1.0
        textures = self.config.texture_components
        mixed: torch.Tensor | None = None
        for prompt, weight in weights.items():
            if weight > 0:  # a finished transition may still name its old prompt
                term = self.prompt_parameters(prompt) * weight
                if total != 1.0:
                    term[:, :-textures] /= total
                mixed = term if mixed is None else mixed + term
        assert mixed is not None  # validated: at least one positive weight
        return mixed

    def open_session(
        self, *, width: int, height: int, seed: int, fps: int | None = None, image: np.ndarray | None = None
    ) -> BuiltinSession:
        """A new stream; raises ValueError for sizes the encoder cannot take. `image`: its first
        frame (a start's `image_reference`; resized at the first chunk, on the session's thread)."""
        return BuiltinSession(self, width=width, height=height, seed=seed, fps=fps, image=image)
