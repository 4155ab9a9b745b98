"""Each vLLM-Omni model's own rules, in one table read from the pinned wheel's pipeline code.

A pipeline enforces its rules inside the engine, after `video.start` has been sent; a start
that breaks one would end in `generation_failed`. This table lets the model refuse it first
(`invalid_start`, naming the rule and what would work), the settings check refuse a
deployment that breaks one at model load, the stand-in engine refuse as the pipeline does,
and `GET /v1/models` and `video.start` `config.model_rules` tell a client what is accepted.

Where each value comes from (vllm-omni 0.30.0; tests/unit/backend/test_vllm_omni_model_rules.py
reads every one of them in the wheel):

- Helios (`diffusion/models/helios/pipeline_helios.py`): sides are floored to a multiple of 16
  (`// 16) * 16`), and stage 2 (`is_enable_stage2`, off by default) halves the latent
  `pyramid_num_stages - 1` times (3 by default) before the transformer's 2x2 patches, so the
  grid is the request's pyramid's (`pyramid_grid`): 64 for the distilled preset, 16 without
  stage 2; stage 2 runs `pyramid_num_inference_steps_list[stage]` steps per stage and counts
  the whole list, so it needs one count per stage; a chunk is
  `(num_latent_frames_per_chunk - 1) * 4 + 1` = 33 frames and a request runs whole chunks
  (`ceil(num_frames / 33)`); the first frame is read from `extra_args["image"]`.
- LingBot-World (`diffusion/models/lingbot_world/pipeline.py`, `LingBotWorldCausalDMDPipeline`):
  the AR-Diffusion cache is built at load for `ar_diffusion_width` x `ar_diffusion_height`
  (832 x 480; the wheel's `deploy/lingbot_world_v2_stepwise.yaml` says a client must ask for
  that size), exactly 4 steps (`LINGBOT_DMD_TIMESTEPS`), `(num_frames - 1) % 4 == 0` and a
  whole number of 3-frame latent blocks (so num_frames % 12 == 9), and one image in
  `multi_modal_data.image` on every request; a chunk is one block, 9 frames first (the
  opening latent decodes to one frame) and 12 after (`_chunk_media_frame_count`).
- GPU memory (`memory`, `MemoryRule`): Helios' `post_decode` concatenates each decoded chunk onto
  `history_video` (old and new coexist: `HISTORY_PEAK_COPIES`), so memory caps its frames;
  LingBot-World decodes each block to uint8 on the host and attends a sink plus a sliding KV
  window (`sink_size`, `sliding_window_num_frames` in its transformer's checkpoint contract), so
  its memory is a fixed `session_state_bytes` and sets no frame cap. Weights come from the
  checkpoints' parameter counts; online FP8 saves the DiT's bytes (the pipeline hands its
  quantization config to the transformer only). `device_memory.py` checks them at load.
- Interaction kinds: `diffusion/interaction/registry.py` (`STRUCTURED_HANDLER_REGISTRY`), which
  lists exactly the table's pipeline classes; `pipeline_interactions` hands them to the model's
  admission as data (tests/unit/backend/test_vllm_omni_refusals.py runs the wheel's coordinator).
- fps: both pipelines read the request's fps for the interaction timeline only (any positive
  value passes); the cap is the rate each model was trained at. `default_fps` is the rate a
  deployment serves it at, the one its reference GPU holds by upstream's published figure
  (`reference_fps`, `fps_source`): what docs/vllm-omni.md promises, and what the GPU check
  (`benchmarks/bench_vllm_omni.py`, `scripts/gpu_check.sh`) fails below.

The API, for code that needs a model's rules (the model, the stand-in engine, scripts):
`find(model, pipeline_class)` gives the table entry (`MODELS` lists them); on an entry,
`size_problem(w, h)`, `fps_problem(fps)` and `start_problem(start)` give the sentence a
refused start gets (None when allowed); `request_problem(...)` what the pipeline itself
refuses of an engine request; `valid_frames(n)`, `request_frames(wanted, cap)` and
`frame_cap(w, h, cap)` the frame-count rule; `memory_peak_bytes(w, h, n)`, `reserved_bytes(...)`
and `load_memory_problem(...)` the memory rule; `paused_chunks(bound, w, h)` how many outputs a
session that reads nothing holds; `chunk_frames(n)` the chunks a request yields;
`for_deployment(extra, (w, h))` the entry as a deployment's `extra_params` and default size
make it; `describe()` what a client is told. `pipeline_interactions(model, pipeline_class)`
gives the modalities the deployed pipeline registers.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rtvideo.core.interaction.refusal import PipelineInteractions
from rtvideo.core.session_config import GeneratorLimits
from rtvideo.core.start_request import StartRequest

#: float32 RGB: what a step-mode pipeline keeps on the GPU per decoded frame
FLOAT32_RGB_BYTES = 3 * 4
#: Helios' decoded history at its peak: `post_decode` concatenates each chunk onto
#: `history_video` (`torch.cat([history, current])`), so for that moment the old history and
#: the new one, a chunk longer, are both on the GPU: 2 x frames x frame bytes near the cap
HISTORY_PEAK_COPIES = 2
#: the GPU memory one engine request's decoded frames may reach at their peak (`memory_peak_bytes`):
#: 8 GiB, i.e. 4 GiB of history held plus its copy while a chunk is concatenated onto it. The
#: default frame cap (1452 at 640x384) comes from it; it is unchanged from the cap stated as
#: "4 GiB held" before, now with the peak the pipeline really reaches
REQUEST_MEMORY_BOUND_BYTES = 8 * 2**30


class MemoryRule(enum.Enum):
    """How a model's GPU memory grows with a request's frames (read from its pipeline's code)."""

    #: every decoded frame stays on the GPU until the request ends, and each chunk's
    #: concatenation holds the old history and the new one at once (Helios' `history_video`):
    #: the peak is `HISTORY_PEAK_COPIES` x frames x width x height x 12 B, so the frame cap is memory's
    DECODED_HISTORY = "decoded_history"
    #: a fixed window (sink frames plus a sliding KV window, per-chunk condition and decode state):
    #: nothing grows with the request's frames (LingBot-World), so memory sets no frame cap
    FIXED_WINDOW = "fixed_window"


GB = 10**9


class FirstFrame(enum.Enum):
    """Whether a model takes a start's `image_reference` as its first frame."""

    OPTIONAL = "optional"
    REQUIRED = "required"


class FirstFrameAt(enum.Enum):
    """Where a pipeline reads the first frame (the engine adapter puts `image_reference` there)."""

    #: the request prompt's `multi_modal_data.image`, a PIL image (vLLM-Omni's endpoint's way)
    PROMPT = "prompt.multi_modal_data.image"
    #: `sampling_params.extra_args["image"]`, a float tensor [1, 3, H, W] in [-1, 1] (Helios step mode)
    EXTRA_ARGS = 'extra_args["image"]'


@dataclass(frozen=True)
class ModelRules(GeneratorLimits):
    """One model's rules. Sizes: `exact_sizes` when the model renders only those, else sides on
    `grid` in [`min_side`, `max_side`]. A request's frame count `n` is valid when
    `n % frame_modulus == frame_remainder` (modulus 1: any count)."""

    name: str = ""
    #: the pipeline classes (`model_class_name`) and model ids this entry answers for
    pipeline_classes: tuple[str, ...] = ()
    model_ids: tuple[str, ...] = ()
    grid: int = 16
    exact_sizes: tuple[tuple[int, int], ...] = ()
    default_size: tuple[int, int] = (640, 384)
    #: the fps a deployment serves it at: what its reference GPU holds (the docs' promise)
    default_fps: int = 16
    #: upstream's published frames a second on its reference GPU (None: not a real-time model)
    reference_fps: float | None = None
    #: where `reference_fps` comes from, and on what GPU
    fps_source: str = ""
    frames_per_chunk: int = 33
    #: the first chunk's frames when it differs (LingBot-World: its opening latent decodes to one frame)
    first_chunk_frames: int | None = None
    frame_modulus: int = 1
    frame_remainder: int = 0
    #: the only step count the pipeline runs (None: any)
    steps: int | None = None
    first_frame: FirstFrame = FirstFrame.OPTIONAL
    #: where the pipeline reads the first frame (the engine adapter puts it there)
    first_frame_at: FirstFrameAt = FirstFrameAt.PROMPT
    #: whether a request's first output frame is its first frame itself (an image-to-video
    #: pipeline whose temporal mask pins frame 0 to the image: LingBot-World's `_prepare_condition`);
    #: a continuation from the viewer's last frame then drops it (`EngineChunkSource`)
    repeats_first_frame: bool = False
    interactions: frozenset[str] = frozenset()
    #: the grid follows the pyramid a request runs (`pyramid_grid`, Helios), else `grid` is fixed
    pyramid: bool = False
    #: the deploy config's `model_config` keys (width, height) the one size comes from
    #: (`for_model_config`; LingBot-World sizes its AR cache from them at load)
    size_keys: tuple[str, str] | None = None
    #: the real-time preset: sampling fields and `extra_params` (the engine's `extra_args`)
    preset: Mapping[str, Any] = field(default_factory=dict)
    #: the longest time to the first chunk a deployment of this model passes its GPU check with
    #: (ours, not the wheel's: a viewer waits this long for the first frame)
    first_chunk_budget_seconds: float = 5.0
    #: how its GPU memory grows with a request's frames (`memory_peak_bytes`, `frame_cap`)
    memory: MemoryRule = MemoryRule.DECODED_HISTORY
    #: its weights on the GPU in the deploy config's dtype (bf16), bytes: parameters x 2
    weights_bytes: int = 0
    #: what online FP8 (the deploy config's `quantization: fp8`) saves of them: the DiT's
    #: parameters x 1 B (the pipeline hands the quantization config to its transformer only)
    fp8_saving_bytes: int = 0
    #: a session's fixed GPU state under `MemoryRule.FIXED_WINDOW` (KV window, per-block state)
    session_state_bytes: int = 0
    #: the checkpoint's license, as its model card states it (docs/vllm-omni.md)
    license: str = ""
    #: bytes a pixel of an engine output takes when it reaches our code: Helios hands over its
    #: VAE's float32 RGB (12), LingBot-World uint8 RGB (3, `_uint8_frames`)
    output_bytes_per_pixel: int = FLOAT32_RGB_BYTES

    def realtime_problems(self, first_chunk_seconds: float | None, delivered_fps: float | None, fps: int) -> list[str]:
        """Why a measured session is not real time for this model: its frames came slower than
        the session's `fps`, or its first chunk later than the budget (empty when it is)."""
        problems = []
        if first_chunk_seconds is None or first_chunk_seconds > self.first_chunk_budget_seconds:
            problems.append(
                f"{self.name}: time to first chunk {first_chunk_seconds} s is over its budget of "
                f"{self.first_chunk_budget_seconds:g} s"
            )
        if delivered_fps is None or delivered_fps < fps:
            problems.append(f"{self.name}: delivered {delivered_fps} fps is below the session's {fps} fps")
        elif delivered_fps < self.default_fps:
            problems.append(
                f"{self.name}: delivered {delivered_fps} fps is below the {self.default_fps} fps it is "
                f"documented to serve ({self.fps_source or 'docs/vllm-omni.md'})"
            )
        return problems

    def request_length(self, chunks: int) -> int:
        """The frames of a request of `chunks` whole chunks (a count the pipeline runs)."""
        first = self.first_chunk_frames or self.frames_per_chunk
        return first + (max(1, chunks) - 1) * self.frames_per_chunk

    def size_problem(self, width: int, height: int) -> str | None:
        problem = GeneratorLimits.size_problem(self, width, height)
        if problem is not None and " must be an integer" in problem:
            return problem
        if self.exact_sizes:
            if (width, height) in self.exact_sizes:
                return None
            sizes = ", ".join(f"{w}×{h}" for w, h in self.exact_sizes)
            return f"{self.name} renders {sizes} only, not {width}×{height}"
        for name, side in (("width", width), ("height", height)):
            if side % self.grid or not self.min_side <= side <= self.max_side:
                width0, height0 = self.default_size
                return (
                    f"{self.name}: {name} {side} is not supported: use a multiple of {self.grid} "
                    f"from {self.min_side} to {self.max_side} (e.g. {width0}×{height0})"
                )
        return None

    def fps_problem(self, fps: int) -> str | None:
        if not 1 <= fps <= self.max_fps:
            return f"{self.name}: fps {fps} is not supported: use 1 to {self.max_fps}"
        return None

    def start_problem(self, start: StartRequest) -> str | None:
        if self.first_frame is FirstFrame.REQUIRED and start.image_reference is None:
            return f"image_reference is required by {self.name} (its first frame)"
        steps = start.num_inference_steps
        if steps is None:
            steps = self.preset.get("num_inference_steps")
        if self.steps is not None and steps is not None and steps != self.steps:
            return f"{self.name} runs exactly {self.steps} inference steps, not {steps}"
        if self.pyramid and start.extra_params:  # the start changes the pyramid its size must fit
            extra = {**self.preset.get("extra_params", {}), **start.extra_params}
            problem = pyramid_problem(self.name, extra)
            if problem is None:
                width, height = start.width or self.default_size[0], start.height or self.default_size[1]
                problem = self.for_deployment(extra).size_problem(width, height)
            return problem
        return None

    def request_problem(
        self, width: int, height: int, num_frames: int, steps: int | None, extra: Mapping[str, Any], image: bool
    ) -> str | None:
        """What the pipeline refuses of an engine request (its `sampling_params` and whether it
        carries a first frame), in our words; None when the pipeline runs it. The stand-in
        engine refuses by this, as the pipeline would inside the engine."""
        problem = pyramid_problem(self.name, extra) if self.pyramid else None
        rules = self.for_deployment(extra) if problem is None else self
        problem = problem or rules.size_problem(width, height)
        if problem is None and not self.valid_frames(num_frames):
            problem = f"{self.name}: num_frames {num_frames} is not a count it runs ({self.frames_rule()})"
        if problem is None and self.steps is not None and steps is not None and steps != self.steps:
            problem = f"{self.name} runs exactly {self.steps} inference steps, not {steps}"
        if problem is None and self.first_frame is FirstFrame.REQUIRED and not image:
            problem = f"image_reference is required by {self.name} (its first frame)"
        return problem

    def chunk_frames(self, num_frames: int) -> list[int]:
        """The frames of each chunk the pipeline yields for a request of `num_frames` (a count it
        runs): whole chunks, the first `first_chunk_frames` long where that is set."""
        first = self.first_chunk_frames or self.frames_per_chunk
        rest = math.ceil(max(0, num_frames - first) / self.frames_per_chunk)
        return [first] + [self.frames_per_chunk] * rest

    def frames_rule(self) -> str:
        if self.frame_modulus == 1:
            return f"any, in whole {self.frames_per_chunk}-frame chunks"
        return f"n % {self.frame_modulus} == {self.frame_remainder}"

    def for_deployment(self, extra: Mapping[str, Any], size: tuple[int, int] | None = None) -> ModelRules:
        """These rules as a deployment (or a request) runs them: the grid of the pyramid its
        `extra` (the engine's `extra_args`) runs, `extra` as the preset's, and its default `size`
        as the example a refusal gives."""
        if not self.pyramid:
            return self
        preset = {**self.preset, "extra_params": dict(extra)}
        return dataclasses.replace(
            self, grid=pyramid_grid(extra), preset=preset, default_size=size or self.default_size
        )

    def for_model_config(self, model_config: Mapping[str, Any]) -> ModelRules:
        """These rules with the one size a deploy config's `model_config` sets (`size_keys`)."""
        if self.size_keys is None:
            return self
        width, height = (model_config.get(key) for key in self.size_keys)
        if (
            not (isinstance(width, int) and isinstance(height, int))
            or isinstance(width, bool)
            or isinstance(height, bool)
        ):
            return self  # absent (the pipeline's defaults, as in the table) or malformed (the engine's to report)
        size = (width, height)
        return dataclasses.replace(self, exact_sizes=(size,), default_size=size, min_side=min(size), max_side=max(size))

    def frame_cap(self, width: int, height: int, cap: int) -> int:
        """The longest request: within `cap` (`vllm_omni_max_request_frames`) and, where memory
        grows with frames, within the memory bound at this size."""
        memory = self.memory_cap(width, height)
        top = self.largest_frames(cap)
        return top if memory is None else min(top, memory)

    def valid_frames(self, frames: int) -> bool:
        return frames >= 1 and frames % self.frame_modulus == self.frame_remainder % self.frame_modulus

    def request_frames(self, wanted: int, cap: int) -> int:
        """The engine request's frame count: the smallest valid count that covers `wanted`,
        never above the largest valid count within `cap` (the session is cut to its own length)."""
        top = self.largest_frames(cap)
        step = self.frame_modulus
        first = self.frame_remainder % step or step
        covering = first if wanted <= first else first + math.ceil((wanted - first) / step) * step
        return min(covering, top)

    def largest_frames(self, cap: int) -> int:
        """The largest valid frame count not above `cap`, in whole chunks (a request runs whole chunks)."""
        step = self.frame_modulus
        first = self.frame_remainder % step or step
        top = first if cap <= first else first + (cap - first) // step * step
        if self.frame_modulus == 1:  # any count: whole chunks, so the engine never runs past the cap
            top = max(self.frames_per_chunk, cap // self.frames_per_chunk * self.frames_per_chunk)
        return top

    def memory_cap(self, width: int, height: int, bound: int = REQUEST_MEMORY_BOUND_BYTES) -> int | None:
        """The largest valid request whose decoded frames stay under `bound` bytes at their peak at
        this size (`memory_peak_bytes`); None where memory sets no cap (`MemoryRule.FIXED_WINDOW`)."""
        if self.memory is MemoryRule.FIXED_WINDOW:
            return None
        return self.history_cap(width, height, bound)

    def history_cap(self, width: int, height: int, bound: int = REQUEST_MEMORY_BOUND_BYTES) -> int:
        """The largest valid request whose decoded history stays under `bound` bytes at its peak
        (`MemoryRule.DECODED_HISTORY`'s arithmetic, whatever this model's rule)."""
        per_frame = width * height * FLOAT32_RGB_BYTES * HISTORY_PEAK_COPIES
        return self.largest_frames(max(1, bound // per_frame))

    def memory_peak_bytes(self, width: int, height: int, frames: int) -> int:
        """One session's GPU memory at its peak beyond the weights, for a request of `frames` at
        this size: Helios' decoded history and its copy during the last concatenation, or
        LingBot-World's fixed window whatever the length."""
        if self.memory is MemoryRule.FIXED_WINDOW:
            return self.session_state_bytes
        return HISTORY_PEAK_COPIES * frames * width * height * FLOAT32_RGB_BYTES

    def output_chunk_bytes(self, width: int, height: int) -> int:
        """One full chunk of engine output at this size, as it waits in a session's output queue."""
        return self.frames_per_chunk * width * height * self.output_bytes_per_pixel

    def paused_chunks(self, queue_bytes: int, width: int, height: int) -> int:
        """The chunks a session that reads nothing (a paused one) holds before the next output is
        refused and the session ended (`output_queue.OutputQueue.offer`: taken while below the bound)."""
        return max(1, math.ceil(queue_bytes / self.output_chunk_bytes(width, height)))

    def reserved_bytes(self, width: int, height: int, frames: int, sessions: int, fp8: bool) -> int:
        """What a deployment holds on its GPU before activations: the weights (less FP8's saving
        when on) and `sessions` sessions at their peak (`load_memory_problem`)."""
        weights = self.weights_bytes - (self.fp8_saving_bytes if fp8 else 0)
        return weights + sessions * self.memory_peak_bytes(width, height, frames)

    def load_memory_problem(
        self, device_bytes: int, width: int, height: int, frames: int, sessions: int, fp8: bool
    ) -> str | None:
        """Why this deployment cannot fit a device of `device_bytes` (None when it fits), with the
        numbers: what is reserved against what the device has."""
        weights = self.weights_bytes - (self.fp8_saving_bytes if fp8 else 0)
        session = self.memory_peak_bytes(width, height, frames)
        reserved = weights + sessions * session
        if reserved <= device_bytes:
            return None
        return (
            f"{self.name} needs {reserved / GB:.1f} GB of GPU memory before activations, over the "
            f"device's {device_bytes / GB:.1f} GB: weights {weights / GB:.1f} GB"
            f"{' (FP8)' if fp8 else ''} + {sessions} session(s) x {session / GB:.1f} GB "
            f"({'its fixed KV window and state' if self.memory is MemoryRule.FIXED_WINDOW else f'{frames} frames of decoded history at {width}x{height}, twice at its peak'}). "
            + (
                "Use quantization: fp8 (deploy/gpu/lingbot_world_h100_fp8.yaml), a larger GPU"
                if self.fp8_saving_bytes and not fp8
                else "Use a larger GPU"
            )
            + ", fewer sessions or a lower vllm_omni_max_request_frames"
        )

    def describe(self) -> dict[str, Any]:
        """What a client is told (`GET /v1/models`, `video.start` `config.model_rules`)."""
        sizes: dict[str, Any] = (
            {"sizes": [[w, h] for w, h in self.exact_sizes]}
            if self.exact_sizes
            else {"size_multiple": self.grid, "min_side": self.min_side, "max_side": self.max_side}
        )
        return {
            "name": self.name,
            **sizes,
            "max_fps": self.max_fps,
            "frames_per_chunk": self.frames_per_chunk,
            "interactions": sorted(self.interactions),
            "image_reference": self.first_frame.value,
            **({"num_inference_steps": self.steps} if self.steps is not None else {}),
        }

    def preset_copy(self) -> dict[str, Any]:
        preset = copy.deepcopy(dict(self.preset))
        preset.setdefault("extra_params", {})
        return preset


#: Helios' pipeline defaults for stage 2 (`pipeline_helios.py` `prepare_encode`): off, 3 stages
HELIOS_STAGE2_DEFAULT = False
HELIOS_STAGES_DEFAULT = 3
#: a Helios side stays whole through the VAE (8) and the transformer's 2x2 patches
HELIOS_BASE_GRID = 16
#: the stages Helios' scheduler has timesteps for (`scheduling_helios.py`, `stages: int = 3`, as
#: the checkpoints' scheduler configs keep it): stage 2 cannot run more
HELIOS_SCHEDULER_STAGES = 3


def _stages(extra: Mapping[str, Any]) -> int | None:
    stages = extra.get("pyramid_num_stages", HELIOS_STAGES_DEFAULT)
    if isinstance(stages, bool) or not isinstance(stages, int) or stages < 1:
        return None
    return stages


def pyramid_grid(extra: Mapping[str, Any]) -> int:
    """The side multiple a Helios request needs with `extra` (its `extra_args`): 16, doubled for
    each halving stage 2 makes before the 2x2 patches (`pyramid_num_stages - 1`)."""
    if not extra.get("is_enable_stage2", HELIOS_STAGE2_DEFAULT):
        return HELIOS_BASE_GRID
    return HELIOS_BASE_GRID * 2 ** ((_stages(extra) or 1) - 1)


def pyramid_problem(name: str, extra: Mapping[str, Any]) -> str | None:
    """Why Helios' stage 2 cannot run `extra`: a stage count outside its scheduler's, or a step
    list without one count per stage (it indexes the list by stage and counts all of it)."""
    if not extra.get("is_enable_stage2", HELIOS_STAGE2_DEFAULT):
        return None
    stages = _stages(extra)
    if stages is None or stages > HELIOS_SCHEDULER_STAGES:
        return (
            f"{name}: pyramid_num_stages must be 1 to {HELIOS_SCHEDULER_STAGES} (its scheduler's stages), "
            f"not {extra.get('pyramid_num_stages')!r}"
        )
    steps = extra.get("pyramid_num_inference_steps_list", [10] * HELIOS_STAGES_DEFAULT)
    if not isinstance(steps, list) or len(steps) != stages:
        return f"{name}: pyramid_num_inference_steps_list needs one step count per stage ({stages}), not {steps!r}"
    return None


#: the step count a request gets when neither the start, the model's preset nor the engine's
#: defaults give one: streaming runs the step scheduler, which asserts a count
#: (`sched/step_scheduler.py` `_get_total_steps`); the Helios pipelines' own fallback
#: (`extra.get("num_inference_steps", 50)`). Helios-Distilled's pyramid list sets its real steps.
STEP_MODE_DEFAULT_STEPS = 50


# --- GPU memory, from each model's own code (docs/vllm-omni.md, "GPU memory") ------------------
#: bf16 bytes a parameter
BF16_BYTES = 2
#: a Wan-2.1-14B-sized DiT (both models' transformers: 40 blocks of width 5120, FFN 13824):
#: per block self- and cross-attention (4 x 5120^2 each) and the FFN (2 x 5120 x 13824)
WAN14B_DIT_PARAMS = 40 * (8 * 5120 * 5120 + 2 * 5120 * 13824)
#: the UMT5-XXL text encoder both pipelines load (its encoder: 5.7 B parameters)
UMT5_XXL_ENCODER_PARAMS = 5_680_000_000
#: the Wan VAE (127 M parameters; Helios loads it in float32, LingBot-World in the deploy dtype)
WAN_VAE_PARAMS = 127_000_000
#: LingBot-World's transformer (`transformer.py`, `checkpoint_contract`) and cache geometry at 832x480
LINGBOT_LAYERS, LINGBOT_HEADS, LINGBOT_HEAD_DIM = 40, 40, 128
LINGBOT_SINK_FRAMES, LINGBOT_WINDOW_FRAMES, LINGBOT_BLOCK_FRAMES = 9, 18, 3
#: post-patch tokens of one latent frame: (480 / 8 / 2) x (832 / 8 / 2)
LINGBOT_TOKENS_PER_FRAME = (480 // 16) * (832 // 16)
#: the text cross-attention cache (`_MAX_SEQUENCE_LENGTH`)
LINGBOT_TEXT_TOKENS = 512
#: K and V of every layer for one latent frame, bf16: 1.28 GB
LINGBOT_KV_FRAME_BYTES = 2 * LINGBOT_LAYERS * LINGBOT_HEADS * LINGBOT_HEAD_DIM * LINGBOT_TOKENS_PER_FRAME * BF16_BYTES
#: the paged KV one session keeps (`kv_cache/manager.py`): its sink and sliding window
#: (`sliding_window_num_frames`, sinks included), the block in flight and its scratch block
LINGBOT_KV_FRAMES = LINGBOT_WINDOW_FRAMES + LINGBOT_BLOCK_FRAMES + LINGBOT_BLOCK_FRAMES
#: what one LingBot-World session holds whatever its length (`ar_diffusion_kv_cache_spec`): the KV
#: above, the text cross-attention K/V, and the camera modulation cache (scale and shift of every
#: layer for one block's tokens, one GPU); condition and decode state are megabytes
LINGBOT_SESSION_STATE_BYTES = (
    LINGBOT_KV_FRAMES * LINGBOT_KV_FRAME_BYTES
    + 2 * LINGBOT_LAYERS * LINGBOT_HEADS * LINGBOT_HEAD_DIM * LINGBOT_TEXT_TOKENS * BF16_BYTES
    + 2
    * LINGBOT_LAYERS
    * LINGBOT_TOKENS_PER_FRAME
    * LINGBOT_BLOCK_FRAMES
    * LINGBOT_HEADS
    * LINGBOT_HEAD_DIM
    * BF16_BYTES
)


#: Helios-Distilled's real-time preset, as vLLM-Omni's streaming example runs it
HELIOS_DISTILLED_PRESET: dict[str, Any] = {
    "guidance_scale": 1.0,
    "extra_params": {
        "is_enable_stage2": True,
        "pyramid_num_stages": 3,
        "pyramid_num_inference_steps_list": [1, 1, 1],
        "is_amplify_first_chunk": True,
    },
}

HELIOS_DISTILLED = ModelRules(
    name="Helios-Distilled",
    pipeline_classes=("HeliosPyramidPipeline",),
    model_ids=("BestWishYsh/Helios-Distilled",),
    min_side=128,
    max_side=1280,
    max_fps=24,
    grid=pyramid_grid(HELIOS_DISTILLED_PRESET["extra_params"]),
    pyramid=True,
    default_size=(640, 384),
    frames_per_chunk=33,
    first_frame_at=FirstFrameAt.EXTRA_ARGS,
    interactions=frozenset({"prompt"}),
    preset=HELIOS_DISTILLED_PRESET,
    first_chunk_budget_seconds=5.0,
    default_fps=16,
    reference_fps=19.5,
    fps_source=(
        "the Helios paper (arXiv 2603.04379, PKU-YuanGroup/Helios): 19.5 fps on one H100 with its own code, "
        "not vLLM-Omni"
    ),
    memory=MemoryRule.DECODED_HISTORY,
    weights_bytes=(WAN14B_DIT_PARAMS + UMT5_XXL_ENCODER_PARAMS) * BF16_BYTES + WAN_VAE_PARAMS * 4,
    license="Apache-2.0",
)

#: Helios without stage 2 (the base pipeline): the 16-pixel grid, 50 steps by default
HELIOS = ModelRules(
    name="Helios",
    pipeline_classes=("HeliosPipeline",),
    model_ids=("BestWishYsh/Helios-Base",),
    min_side=128,
    max_side=1280,
    max_fps=24,
    grid=pyramid_grid({}),
    pyramid=True,
    default_size=(640, 384),
    frames_per_chunk=33,
    first_frame_at=FirstFrameAt.EXTRA_ARGS,
    interactions=frozenset({"prompt"}),
    preset={"extra_params": {}},
    first_chunk_budget_seconds=30.0,  # 50 steps with guidance: an offline model, checked for completeness
    memory=MemoryRule.DECODED_HISTORY,
    weights_bytes=(WAN14B_DIT_PARAMS + UMT5_XXL_ENCODER_PARAMS) * BF16_BYTES + WAN_VAE_PARAMS * 4,
    license="Apache-2.0",
)

#: LingBot-World's causal DMD pipeline on the AR-Diffusion engine (stepwise deploy config)
LINGBOT_WORLD = ModelRules(
    name="LingBot-World",
    pipeline_classes=("LingBotWorldCausalDMDPipeline",),
    # the checkpoint the pipeline's `checkpoint_contract` describes (v2, 14B, causal, 4-step DMD)
    model_ids=("robbyant/lingbot-world-v2-14b-causal-fast-diffusers",),
    min_side=480,
    max_side=832,
    max_fps=16,
    exact_sizes=((832, 480),),
    default_size=(832, 480),
    size_keys=("ar_diffusion_width", "ar_diffusion_height"),
    frames_per_chunk=12,
    first_chunk_frames=9,
    frame_modulus=12,
    frame_remainder=9,
    steps=4,
    first_frame=FirstFrame.REQUIRED,
    first_frame_at=FirstFrameAt.PROMPT,
    repeats_first_frame=True,
    interactions=frozenset({"camera"}),
    preset={"num_inference_steps": 4, "extra_params": {"flow_shift": 5.0}},
    first_chunk_budget_seconds=5.0,
    # served at the rate it is made (slower motion than its 16 fps training rate, no stall)
    default_fps=5,
    reference_fps=5.0,
    fps_source="vLLM-Omni issue #7074: about 5 fps at 832x480 on one H200",
    # a sliding KV window, per-block condition and decode state: nothing grows with frames
    memory=MemoryRule.FIXED_WINDOW,
    weights_bytes=(WAN14B_DIT_PARAMS + UMT5_XXL_ENCODER_PARAMS + WAN_VAE_PARAMS) * BF16_BYTES,
    fp8_saving_bytes=WAN14B_DIT_PARAMS,
    session_state_bytes=LINGBOT_SESSION_STATE_BYTES,
    output_bytes_per_pixel=3,
    license="CC BY-NC-SA (non-commercial)",
)

#: every model with rules, in the order they are looked up
MODELS: tuple[ModelRules, ...] = (HELIOS_DISTILLED, HELIOS, LINGBOT_WORLD)


def find(model: str, pipeline: str | None) -> ModelRules | None:
    """The rules of the deployed model: by its pipeline class (`model_class_name`, the deploy
    config's, or the model directory's `_class_name`), else by its model id; None when unknown
    (then only the generic limits apply and the engine has the last word)."""
    if pipeline is not None:
        for rules in MODELS:
            if pipeline in rules.pipeline_classes:
                return rules
    for rules in MODELS:
        if model in rules.model_ids:
            return rules
    return None


def pipeline_interactions(model: str, pipeline: str | None) -> PipelineInteractions | None:
    """The deployed model's rule about interactions, as the model's admission applies it
    (`rtvideo.core.interaction.refusal`): the modalities vLLM-Omni's handler registry
    (`diffusion/interaction/registry.py`, `STRUCTURED_HANDLER_REGISTRY`) gives its pipeline
    class. The registry lists exactly this table's classes (a test reads it in the wheel), so a
    class no entry names has no handler at all; without a class, the entry of the model id
    names it; None when neither is known (then every event is forwarded and the engine decides)."""
    if pipeline is not None:
        entry = next((rules for rules in MODELS if pipeline in rules.pipeline_classes), None)
        return PipelineInteractions(pipeline, entry.interactions if entry is not None else frozenset())
    entry = find(model, None)
    if entry is None or not entry.pipeline_classes:
        return None
    return PipelineInteractions(entry.pipeline_classes[0], entry.interactions)
