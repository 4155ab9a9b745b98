"""vLLM-Omni 0.30's REAL engine on a CPU, for tests/unit/backend/test_vllm_omni_real_engine_cpu.py.

Runs only in an interpreter that has vllm 0.30 and vllm-omni 0.30 installed (never the project's
CI venv; docs/vllm-omni.md, "The real engine on a CPU", says how one was made):

    python -m tests.support.omni_cpu OUT.json

writes a tiny randomly initialised Helios (diffusers' own classes, a few layers, 2 MB) to a temp
directory, starts `vllm_omni.AsyncOmni` on it as the Triton model does (`EngineHost`,
`diffusion_streaming_output=True`), runs one session through this adapter's `EngineSources` /
`EngineChunkSource` (events admitted as the session admits them) and writes what it saw as JSON.

vLLM-Omni 0.30 has no CPU platform: without a GPU it resolves `UnspecifiedOmniPlatform`, which
raises `NotImplementedError` for what the diffusion worker needs. `patch_cpu_platform` turns on
tests/real_engine/cpu_platform.py, the least that lets the engine run (each patch names the line
that stopped it); it is not the GPU path, so what this proves is the engine's own request, interaction and output code, not its
kernels or its speed. The engine's warm-up dummy run (512x512, most of a two-minute start on a
CPU) is skipped.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # `rtvideo` and `tests` from this checkout

from tests.real_engine import cpu_platform  # after the checkout is on the path

PIPELINE = "HeliosPyramidPipeline"
WIDTH = HEIGHT = 64
FRAMES_PER_CHUNK = 33
CHUNKS = 6
#: the Helios-Distilled preset's keys, with one step per pyramid stage
EXTRA = {"is_enable_stage2": True, "pyramid_num_stages": 3, "pyramid_num_inference_steps_list": [1, 1, 1]}


def write_text_and_vae(out: Path, text_dim: int, max_length: int) -> None:
    """The parts the tiny Helios and the tiny LingBot-World share: a character tokenizer, a
    1-layer UMT5 text encoder of `text_dim`, and a base_dim-8 Wan VAE (random, from the
    caller's seed)."""
    from diffusers import AutoencoderKLWan
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, UMT5Config, UMT5EncoderModel

    words = ["<pad>", "</s>", "<unk>", " "] + [chr(c) for c in range(97, 123)]
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="<pad>", eos_token="</s>", unk_token="<unk>", model_max_length=max_length
    ).save_pretrained(out / "tokenizer")
    UMT5EncoderModel(
        UMT5Config(
            vocab_size=len(words),
            d_model=text_dim,
            d_kv=8,
            d_ff=64,
            num_layers=1,
            num_heads=2,
            relative_attention_num_buckets=8,
            tie_word_embeddings=True,
        )
    ).save_pretrained(out / "text_encoder")
    AutoencoderKLWan(
        base_dim=8, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1, temperal_downsample=[False, True, True]
    ).save_pretrained(out / "vae")


def write_tiny_helios(out: Path) -> Path:
    """A randomly initialised Helios in the diffusers layout vLLM-Omni loads (`model_index.json`
    with `_class_name` HeliosPyramidPipeline, tokenizer, text_encoder, vae, transformer, scheduler)."""
    import torch
    from diffusers.models.transformers.transformer_helios import HeliosTransformer3DModel

    torch.manual_seed(0)
    out.mkdir(parents=True, exist_ok=True)
    text_dim = 32
    write_text_and_vae(out, text_dim, max_length=64)
    HeliosTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=2,
        attention_head_dim=32,
        in_channels=16,
        out_channels=16,
        text_dim=text_dim,
        freq_dim=32,
        ffn_dim=64,
        num_layers=2,
        rope_dim=(12, 10, 10),
        guidance_cross_attn=True,
        zero_history_timestep=True,
        has_multi_term_memory_patch=True,
    ).save_pretrained(out / "transformer")
    (out / "scheduler").mkdir(exist_ok=True)
    (out / "scheduler" / "scheduler_config.json").write_text(
        json.dumps(
            {
                "_class_name": "HeliosDMDScheduler",
                "num_train_timesteps": 1000,
                "shift": 1.0,
                "stages": 3,
                "stage_range": [0, 1 / 3, 2 / 3, 1],
                # Helios' own 1/3 makes the stage-2 block-noise covariance (1+g)I - g*11^T singular
                # (its eigenvalue 1-3g is 0, plus 1e-8): float32 Cholesky on a CPU refuses it
                "gamma": 0.3,
                "scheduler_type": "dmd",
                "use_flow_sigmas": True,
                "use_dynamic_shifting": False,
                "time_shift_type": "linear",
                "prediction_type": "flow_prediction",
            }
        )
    )
    (out / "model_index.json").write_text(
        json.dumps(
            {
                "_class_name": PIPELINE,
                "scheduler": ["diffusers", "HeliosDMDScheduler"],
                "text_encoder": ["transformers", "UMT5EncoderModel"],
                "tokenizer": ["transformers", "PreTrainedTokenizerFast"],
                "transformer": ["diffusers", "HeliosTransformer3DModel"],
                "vae": ["diffusers", "AutoencoderKLWan"],
            }
        )
    )
    return out


def patch_cpu_platform() -> None:
    """vLLM-Omni's CPU patches (tests/real_engine/cpu_platform.py, the one copy), on in this process
    and, through the environment, in the engine's workers where that environment installs them."""
    os.environ[cpu_platform.SWITCH] = "1"
    cpu_platform.install()


class _Encoder:
    """The session's encoder stand-in: records what the adapter hands it."""

    def __init__(self, seen: list[dict[str, Any]]) -> None:
        self._seen = seen

    def encode_chunk(self, frames: np.ndarray) -> bytes:
        self._seen.append({"shape": list(frames.shape), "dtype": str(frames.dtype)})
        return b"x"

    def close(self) -> bytes:
        return b""


def run_session(model: Path) -> dict[str, Any]:
    """One bounded session (CHUNKS x 33 frames at 64x64) through the adapter against the real engine:
    "early" admitted before the first output, "empty" (refused before forwarding), and "late" admitted
    once a chunk reports "early" started (so the two never meet at one boundary, where the newest wins)."""
    patch_cpu_platform()
    from vllm_omni import AsyncOmni

    from rtvideo.backend.runtime.sources import FailedEvent
    from rtvideo.backend.vllm_omni.engine import EngineHost, is_start_notice
    from rtvideo.backend.vllm_omni.source import EngineSources
    from tests.support.probes import prompt_update
    from tests.support.session_configs import session_config

    raw: list[dict[str, Any]] = []

    class RecordingAsyncOmni(AsyncOmni):
        """The real engine; records each output's `images[0]` as it leaves `generate()`."""

        async def generate(self, *args: Any, **kwargs: Any) -> Any:
            async for output in super().generate(*args, **kwargs):
                if is_start_notice(output):  # the engine admitted the request: no frames, no chunk
                    yield output
                    continue
                image = np.asarray(output.images[0]) if output.images else None
                raw.append(
                    {
                        "shape": None if image is None else list(image.shape),
                        "dtype": None if image is None else str(image.dtype),
                        "min": None if image is None else float(image.min()),
                        "max": None if image is None else float(image.max()),
                        "finished": bool(getattr(output, "finished", False)),
                    }
                )
                yield output

    t0 = time.monotonic()
    host = EngineHost(
        RecordingAsyncOmni,
        model=str(model),
        engine_args={"diffusion_streaming_output": True, "enforce_eager": True},
        health_seconds=30,
    )
    started_in = time.monotonic() - t0
    encoded: list[dict[str, Any]] = []
    sources = EngineSources(host, {}, 3600, lambda w, h, fps: _Encoder(encoded))
    config = session_config(
        prompt="a harbour at dawn",
        format="mp4",
        model="tiny-helios",
        width=WIDTH,
        height=HEIGHT,
        frames_per_chunk=FRAMES_PER_CHUNK,
        default_transition_chunks=1,
        num_frames=CHUNKS * FRAMES_PER_CHUNK,
        seed=3,
        sampling={"guidance_scale": 1.0, "num_inference_steps": 1, "extra_params": EXTRA},
    )
    chunks: list[dict[str, Any]] = []
    failed: list[dict[str, str]] = []
    refusal: str | None = None
    try:
        source = sources.open(config, "cpu-session")
        source.admit_event(
            prompt_update("early", "lanterns", 1)
        )  # before the first output: held by the host until the engine admits the request
        source.admit_event(
            prompt_update("empty", "", 1)
        )  # the parser refuses it from a client; forwarded here, the engine itself refuses it
        while len(chunks) < CHUNKS:
            item = source.next_chunk(FRAMES_PER_CHUNK)
            if isinstance(item, FailedEvent):
                failed.append({"event_id": item.event_id, "why": item.why})
                continue
            if item is None:
                break
            plan = item.plan
            chunks.append(
                {
                    "index": plan.generation_chunk_index,
                    "started": list(plan.started),
                    "active": list(plan.active),
                    "completed": list(plan.completed),
                    "progress": dict(plan.progress),
                }
            )
            if plan.generation_chunk_index == 0:
                # what AsyncOmni.submit_interaction_async itself refuses, asked while the request
                # runs: a finished one is refused by the host first
                try:
                    host.interact("cpu-session", {"event_id": "raw", "event": {"prompt": ""}}).result(30)
                except Exception as exc:  # noqa: BLE001 - reported
                    refusal = f"{type(exc).__name__}: {exc}"
            if "early" in plan.started:
                source.admit_event(prompt_update("late", "snow", 0))  # reaches the engine during the next chunk
        source.close()
    finally:
        sources.close()
    return {
        "engine_start_seconds": started_in,
        "raw_outputs": raw,
        "encoded": encoded,
        "chunks": chunks,
        "failed": failed,
        "direct_refusal": refusal,
    }


def main() -> None:
    out = Path(sys.argv[1])
    with tempfile.TemporaryDirectory(prefix="tiny-helios-") as tmp:
        result = run_session(write_tiny_helios(Path(tmp) / "model"))
    out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
