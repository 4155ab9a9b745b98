"""A tiny randomly initialised LingBot-World for vLLM-Omni 0.30.0 on a CPU
(scripts/test_real_engine.sh): `write_tiny_lingbot(out)` writes the layout
`LingBotWorldCausalDMDPipeline` loads (tokenizer/, a 1-layer UMT5 text_encoder/, a base_dim-8
`AutoencoderKLWan` vae/, transformer/ built by vLLM-Omni's own
`CausalLingBotWorldTransformer3DModel`, a UniPC flow scheduler/ and model_index.json, about
0.7 MB), and `write_tiny_deploy(ours, out, side)` the shipped stepwise deploy config with what a
CPU needs changed.

The pipeline's own geometry is kept where it checks it: 16 latent channels (its condition has
4 mask + 16 latent channels), 3-frame blocks, the VAE's x4 time and x8 space. Two things of the
wheel stop a tiny model on a CPU, patched in the real-engine environment only
(tests/real_engine/cpu_platform.py): `CausalLingBotWorldTransformer3DModel.from_config` pins
the 14B checkpoint's geometry (`lingbot_world/transformer.py:998-1031`, "num_attention_heads
must be 40"), and `RotaryEmbeddingWan.forward_native` (`diffusion/layers/rope.py:313`, the path
without the flash-attn kernel) cannot take the 2-D cos/sin tables LingBot hands it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

TEXT_DIM = 32
TRANSFORMER = dict(
    patch_size=[1, 2, 2],
    num_attention_heads=2,
    attention_head_dim=12,
    in_channels=36,  # 16 noise + 4 temporal mask + 16 image latent (pipeline-fixed)
    out_channels=16,  # Wan z_dim (pipeline-fixed: condition must be 20 channels)
    text_dim=TEXT_DIM,
    freq_dim=32,
    ffn_dim=48,
    num_layers=2,
    cross_attn_norm=True,
    eps=1e-6,
    rope_max_seq_len=1024,
    qk_norm="rms_norm_across_heads",
    sink_size=9,
    num_frames_per_block=3,
    sliding_window_num_frames=18,
    local_attn_size=-1,
)


def write_transformer(out: Path) -> None:
    """Runs in its own process: the vLLM parallel layers need a (1-rank, gloo) distributed init."""
    import torch
    from safetensors.torch import save_file

    from rtvideo.triton.server import free_port

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))  # gloo's rendezvous, this process only
    from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config
    from vllm_omni.diffusion.distributed.parallel_state import (
        init_distributed_environment,
        initialize_model_parallel,
    )

    torch.manual_seed(0)
    with set_current_vllm_config(VllmConfig(device_config=DeviceConfig(device=torch.device("cpu")))):
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo")
        initialize_model_parallel()
        from vllm_omni.diffusion.models.lingbot_world.transformer import CausalLingBotWorldTransformer3DModel

        kwargs = dict(TRANSFORMER)
        kwargs["patch_size"] = tuple(kwargs["patch_size"])
        model = CausalLingBotWorldTransformer3DModel(**kwargs, prefix="transformer")
    state: dict[str, torch.Tensor] = {}
    dim = TRANSFORMER["num_attention_heads"] * TRANSFORMER["attention_head_dim"]
    with torch.no_grad():
        for name, param in model.named_parameters():
            value = param.detach().float()
            if torch.all(value == 0) or not torch.isfinite(value).all() or value.abs().max() > 1e6:
                # vLLM parallel layers allocate torch.empty: give every tensor a small random init
                value = torch.randn_like(value) * 0.02
            if "norm" in name and value.ndim == 1 and name.endswith("weight"):
                value = torch.ones_like(value)
            if ".self_attn.qkv." in name:
                for i, proj in enumerate(("q", "k", "v")):
                    state[name.replace(".self_attn.qkv.", f".self_attn.{proj}.")] = (
                        value[i * dim : (i + 1) * dim].clone().contiguous()
                    )
            else:
                state[name] = value.clone().contiguous()
    (out / "transformer").mkdir(parents=True, exist_ok=True)
    save_file(state, str(out / "transformer" / "diffusion_pytorch_model.safetensors"))
    (out / "transformer" / "config.json").write_text(
        json.dumps({"_class_name": "CausalLingBotWorldTransformer3DModel", **TRANSFORMER}, indent=1)
    )
    torch.distributed.destroy_process_group()


def write_tiny_lingbot(out: Path) -> Path:
    """The model directory (the transformer is built in a process of its own: vLLM's parallel
    layers need a one-rank distributed group)."""
    import torch

    from tests.support.omni_cpu import write_text_and_vae

    torch.manual_seed(0)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_text_and_vae(out, TEXT_DIM, max_length=512)
    if not (out / "transformer" / "config.json").exists():
        # the real-engine environment's CPU platform (tests/real_engine/cpu_platform.py): vLLM-Omni's
        # own distributed set-up counts devices
        env = {**os.environ, "RTVIDEO_REAL_ENGINE_CPU": "1"}
        subprocess.run([sys.executable, "-m", "tests.support.omni_cpu_lingbot", str(out)], check=True, env=env)
    (out / "scheduler").mkdir(exist_ok=True)
    (out / "scheduler" / "scheduler_config.json").write_text(
        json.dumps(
            {
                "_class_name": "UniPCMultistepScheduler",
                "num_train_timesteps": 1000,
                "prediction_type": "flow_prediction",
                "predict_x0": True,
                "use_flow_sigmas": True,
                "use_dynamic_shifting": False,
                "use_beta_sigmas": False,
                "use_exponential_sigmas": False,
                "use_karras_sigmas": False,
                "final_sigmas_type": "zero",
                "timestep_spacing": "linspace",
                "solver_order": 2,
                "flow_shift": 5.0,
            }
        )
    )
    (out / "model_index.json").write_text(
        json.dumps(
            {
                "_class_name": "LingBotWorldCausalDMDPipeline",
                "scheduler": ["diffusers", "UniPCMultistepScheduler"],
                "text_encoder": ["transformers", "UMT5EncoderModel"],
                "tokenizer": ["transformers", "PreTrainedTokenizerFast"],
                "transformer": ["diffusers", "CausalLingBotWorldTransformer3DModel"],
                "vae": ["diffusers", "AutoencoderKLWan"],
            }
        )
    )
    return out


def write_tiny_deploy(ours: Path, out: Path, side: int) -> Path:
    """`ours` (deploy/gpu/lingbot_world_stepwise.yaml) for a CPU: a `side`×`side` AR cache,
    float32, no device list, no VAE sharding, no CUDA-graph warm-up, a KV cache sized for a
    tiny model (the CPU platform reports 16 GiB free, so the GPU fraction would reserve GBs)."""
    import yaml

    config = yaml.safe_load(ours.read_text())
    config["dtype"] = "float32"
    (stage,) = config["stages"]
    stage.pop("devices", None)
    model_config = stage["model_config"]
    model_config.update(lingbot_vae_spatial_sharding=False, ar_diffusion_width=side, ar_diffusion_height=side)
    model_config["ar_diffusion_kv_config"].update(gpu_memory_fraction=0.01, warmup_cudagraph=False)
    out.write_text(yaml.safe_dump(config, sort_keys=False))
    return out


if __name__ == "__main__":
    write_transformer(Path(sys.argv[1]))
