"""A minimal CPU platform for vLLM-Omni 0.30.0, for scripts/test_real_engine.sh's environment only.

vLLM-Omni 0.30 has no CPU platform: without a GPU it resolves `UnspecifiedOmniPlatform`, which
raises `NotImplementedError` for what the diffusion worker needs (docs/vllm-omni.md, "The real
engine on a CPU", lists each stop). The script copies this file into its own environment as
`rtvideo_real_engine_cpu` with a `.pth` line that calls `install()` at every interpreter start
of that environment: Triton's Python-backend stub and each worker process vLLM-Omni spawns
import vLLM-Omni afresh, so a patch made in one process only would not reach the others.

`install()` does nothing unless RTVIDEO_REAL_ENGINE_CPU=1 (pip and other tools of the env run
unpatched), and imports nothing heavy: it puts a finder first on `sys.meta_path` that patches
each module below right after the module's own code has run, wherever it is imported first.
The last two patches are for the tiny LingBot-World (tests/support/omni_cpu_lingbot.py says
why). Never imported by rtvideo.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import inspect
import os
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

#: what the memory queries answer: (free, total) bytes
MEMORY = (16 * 2**30, 24 * 2**30)
#: the environment variable that turns the patches on
SWITCH = "RTVIDEO_REAL_ENGINE_CPU"


def _constant(value: Any) -> classmethod:  # type: ignore[type-arg]
    return classmethod(lambda cls, *a, **k: value)


def _patch_memory(platform: type) -> None:
    # diffusion_model_runner.py:343 -> vllm/utils/mem_utils.py:88 get_current_memory_usage:
    # NotImplementedError; diffusion_model_runner.py:1381 reset_peak_memory_stats: None (the
    # platform forwards unknown names to torch.cpu)
    for name in (
        "get_current_memory_usage",
        "reset_peak_memory_stats",
        "max_memory_allocated",
        "memory_allocated",
        "max_memory_reserved",
        "memory_reserved",
    ):
        setattr(platform, name, _constant(0))
    platform.empty_cache = _constant(None)  # type: ignore[attr-defined]
    platform.mem_get_info = _constant(MEMORY)  # type: ignore[attr-defined]


def _vllm_interface(module: ModuleType) -> None:
    _patch_memory(module.UnspecifiedPlatform)


def _omni_interface(module: ModuleType) -> None:
    cpu = module.UnspecifiedOmniPlatform
    # diffusion/worker/diffusion_worker.py:332 set_device: NotImplementedError (vllm/platforms/interface.py:538)
    cpu.set_device = _constant(None)
    # diffusion/distributed/parallel_state.py:414 init_process_group: "Unknown backend type" (dist_backend "")
    cpu.dist_backend = "gloo"
    cpu.get_device_count = _constant(1)
    cpu.get_diffusion_attn_backend_cls = _constant("vllm_omni.diffusion.attention.backends.sdpa.SDPABackend")
    cpu.supports_torch_inductor = _constant(False)
    cpu.synchronize = _constant(None)
    cpu.get_free_memory = _constant(MEMORY[0])
    cpu.get_device_memory = _constant(MEMORY)
    cpu.get_device_version = _constant(None)
    _patch_memory(cpu)


def _sdpa(module: ModuleType) -> None:
    # diffusion/attention/backends/abstract.py:299 forward dispatches on rocm/cuda/npu/xpu/musa only:
    # "No forward implementation for platform"; SDPA's CUDA path is plain torch SDPA
    module.SDPAImpl.forward = module.SDPAImpl.forward_cuda


def _diffusion_engine(module: ModuleType) -> None:
    # the engine's 512x512 warm-up request (`_dummy_run`, most of a two-minute start on a CPU):
    # num_frames 0 skips it
    module.get_dummy_run_num_frames = lambda *a, **k: 0


def _lingbot_transformer(module: ModuleType) -> None:
    # lingbot_world/transformer.py:998-1031 from_config pins the 14B checkpoint's geometry
    # ("num_attention_heads must be 40"): a tiny model (tests/support/omni_cpu_lingbot.py) is
    # built from its config.json as the class's own __init__ takes it
    cls = module.CausalLingBotWorldTransformer3DModel

    def from_config(klass: type, config: dict[str, Any], *, quant_config: Any = None, prefix: str = "") -> Any:
        names = set(inspect.signature(klass.__init__).parameters) - {"self", "quant_config", "prefix"}
        kwargs = {k: v for k, v in config.items() if k in names}
        if "patch_size" in kwargs:
            kwargs["patch_size"] = tuple(kwargs["patch_size"])
        return klass(**kwargs, quant_config=quant_config, prefix=prefix)

    cls.from_config = classmethod(from_config)


def _rope(module: ModuleType) -> None:
    # diffusion/layers/rope.py:313 RotaryEmbeddingWan.forward_native (the path without the
    # flash-attn rotary kernel) broadcasts cos/sin against x [B, S, H, D/2]; LingBot
    # (lingbot_world/transformer.py:334) hands it the 2-D [S, D/2] tables the kernel path takes
    cls = module.RotaryEmbeddingWan
    native = cls.forward_native

    def forward_native(self: Any, x: Any, cos: Any, sin: Any) -> Any:
        if x.dim() == 4 and cos.dim() == 2 and cos.shape[0] == x.shape[1]:
            cos, sin = cos[None, :, None, :], sin[None, :, None, :]
        return native(self, x, cos, sin)

    cls.forward_native = forward_native


PATCHES: dict[str, Callable[[ModuleType], None]] = {
    "vllm.platforms.interface": _vllm_interface,
    "vllm_omni.platforms.interface": _omni_interface,
    "vllm_omni.diffusion.attention.backends.sdpa": _sdpa,
    "vllm_omni.diffusion.diffusion_engine": _diffusion_engine,
    "vllm_omni.diffusion.models.lingbot_world.transformer": _lingbot_transformer,
    "vllm_omni.diffusion.layers.rope": _rope,
}
#: the modules patched in this process, in order (the driver's evidence)
applied: list[str] = []


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    """Finds each module of PATCHES with the other finders and runs its patch after its code."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        patch = PATCHES.get(fullname)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                run = spec.loader.exec_module

                def exec_module(module: ModuleType, run: Callable[[ModuleType], None] = run) -> None:
                    run(module)
                    patch(module)
                    applied.append(fullname)

                spec.loader.exec_module = exec_module  # type: ignore[method-assign]
                return spec
        return None


def install() -> None:
    """Patch vLLM-Omni's modules as they are imported, when RTVIDEO_REAL_ENGINE_CPU=1."""
    if os.environ.get(SWITCH) != "1" or any(isinstance(f, _PatchAfterImport) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _PatchAfterImport())
    for name, patch in PATCHES.items():  # imported before the finder was installed
        if name in sys.modules and name not in applied:
            patch(sys.modules[name])
            applied.append(name)
