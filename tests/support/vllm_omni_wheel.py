"""vLLM-Omni's own code, read from its wheel at test time (never copied into this repository).

`scripts/setup.sh` downloads the pinned wheel (no dependencies) into `.venv/wheels/`.
`load_interaction()` executes its whole interaction package, `diffusion/interaction/`
(`types.py`, `modality_handlers/{base,prompt,camera}.py`, `registry.py`, `coordinator.py`,
`mixin.py`), with minimal stand-ins for the few vLLM-Omni modules they import that would pull
in vLLM or a GPU: `StepRequestState` (a plain dataclass with the fields the handlers touch) and
`diffusion/models/interface.py`'s `SupportsInteractionApply` protocol (the three methods it
names). `stream_metadata_function()` is the output formatter's
`_stream_metadata_from_diffusion_output`, compiled alone from `diffusion/output_formatter.py`
(the layout of `multimodal_output["metadata"]["stream"]`). torch is the real one (the handlers
blend embeddings with it).
"""

from __future__ import annotations

import ast
import sys
import types
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast, runtime_checkable

from rtvideo.backend.vllm_omni.engine import PINNED_VLLM_OMNI
from tests.support.paths import REPO_ROOT

ROOT = REPO_ROOT
WHEEL = ROOT / ".venv" / "wheels" / f"vllm_omni-{PINNED_VLLM_OMNI}-py3-none-any.whl"
_PACKAGE = "vllm_omni/diffusion/interaction/"
_MODULES = (
    "types",
    "modality_handlers.base",
    "modality_handlers.prompt",
    "modality_handlers.camera",
    "registry",
    "coordinator",
    "mixin",
)

#: modules of later releases' interaction package, loaded (after the handlers) where the wheel has them
_LATER_MODULES = ("modality_handlers.taomate_h3_prompt",)
#: vLLM-Omni 0.32.0rc1 (a release candidate), whose protocol this product also speaks
#: (docs/vllm-omni.md "vLLM-Omni 0.32"); `scripts/setup.sh` downloads it beside the pinned one
RC_VERSION = "0.32.0rc1"
RC_WHEEL = ROOT / ".venv" / "wheels" / f"vllm_omni-{RC_VERSION}-py3-none-any.whl"


def rc_wheel_path() -> Path:
    if not RC_WHEEL.is_file():
        raise FileNotFoundError(f"{RC_WHEEL} is missing: run scripts/setup.sh (it downloads the 0.32 wheel)")
    return RC_WHEEL


def wheel_path() -> Path:
    if not WHEEL.is_file():
        raise FileNotFoundError(f"{WHEEL} is missing: run scripts/setup.sh (it downloads the pinned wheel)")
    return WHEEL


def wheel_source(member: str, wheel: Path | None = None) -> str:
    """One file of the wheel, e.g. `vllm_omni/entrypoints/async_omni.py`."""
    with zipfile.ZipFile(wheel or wheel_path()) as zf:
        return zf.read(member).decode()


@dataclass
class StepRequestState:
    """Stand-in for `vllm_omni.diffusion.worker.utils.StepRequestState`: what the prompt handler uses."""

    request_id: str
    sampling: Any
    prompt_embeds: Any = None
    chunk_index: int = 0
    interaction_sessions: dict[str, Any] = field(default_factory=dict)
    interaction_chunk_metadata: Any = None


@dataclass
class Sampling:
    """Stand-in for the two sampling fields the handler passes to `encode_prompt`."""

    num_outputs_per_prompt: int = 1
    max_sequence_length: int = 512


@runtime_checkable
class SupportsInteractionApply(Protocol):
    """Stand-in for `vllm_omni.diffusion.models.interface.SupportsInteractionApply` (same methods)."""

    def peek_chunk_media(self, state: Any) -> Any: ...

    def apply_interaction_at_chunk_boundary(self, state: Any) -> None: ...

    def prepare_next_chunk(self, state: Any) -> None: ...


def supports_interaction_apply(pipeline: object) -> bool:
    return isinstance(pipeline, SupportsInteractionApply)


_LOADED: dict[str, dict[str, types.ModuleType]] = {}


def load_prompt_handler(wheel: Path | None = None) -> types.ModuleType:
    """vLLM-Omni's `modality_handlers/prompt.py` module (`PromptInteractionHandler`, ...), run from the wheel."""
    return load_interaction(wheel)["modality_handlers.prompt"]


def load_interaction(wheel: Path | None = None) -> dict[str, types.ModuleType]:
    """vLLM-Omni's `diffusion/interaction/` modules run from the wheel, by name relative to the
    package (`"coordinator"`, `"registry"`, `"types"`, `"modality_handlers.prompt"`, ...)."""
    key = str(wheel or wheel_path())
    if key in _LOADED:
        return _LOADED[key]
    stand_ins = {
        "vllm_omni": _package("vllm_omni"),
        "vllm_omni.diffusion": _package("vllm_omni.diffusion"),
        "vllm_omni.diffusion.interaction": _package("vllm_omni.diffusion.interaction"),
        "vllm_omni.diffusion.interaction.modality_handlers": _package(
            "vllm_omni.diffusion.interaction.modality_handlers"
        ),
        "vllm_omni.diffusion.models": _package("vllm_omni.diffusion.models"),
        "vllm_omni.diffusion.models.interface": _module(
            "vllm_omni.diffusion.models.interface",
            SupportsInteractionApply=SupportsInteractionApply,
            supports_interaction_apply=supports_interaction_apply,
        ),
        "vllm_omni.diffusion.worker": _package("vllm_omni.diffusion.worker"),
        "vllm_omni.diffusion.worker.utils": _module(
            "vllm_omni.diffusion.worker.utils", StepRequestState=StepRequestState
        ),
    }
    saved = {name: sys.modules.get(name) for name in stand_ins}
    loaded: dict[str, types.ModuleType] = {}
    try:
        sys.modules.update(stand_ins)
        with zipfile.ZipFile(key) as zf:
            members = set(zf.namelist())
            # 0.32's registry also imports the TaoMate-H3 prompt handler (absent from 0.30)
            extra = [name for name in _LATER_MODULES if _PACKAGE + name.replace(".", "/") + ".py" in members]
            for name in (*_MODULES[:3], *extra, *_MODULES[3:]):
                full = f"vllm_omni.diffusion.interaction.{name}"
                module = types.ModuleType(full)
                module.__file__ = f"{key}!{_PACKAGE}{name.replace('.', '/')}.py"
                sys.modules[full] = module
                loaded[full] = module
                code = compile(zf.read(_PACKAGE + name.replace(".", "/") + ".py"), module.__file__, "exec")
                exec(code, module.__dict__)
    finally:
        for name in list(stand_ins) + list(loaded):
            previous = saved.get(name)
            if previous is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = previous
    modules = {name: loaded[f"vllm_omni.diffusion.interaction.{name}"] for name in (*_MODULES, *extra)}
    _LOADED[key] = modules
    return modules


def stream_metadata_function(wheel: Path | None = None) -> Callable[[Any], dict[str, Any] | None]:
    """`diffusion/output_formatter.py`'s `_stream_metadata_from_diffusion_output`, compiled alone
    from the wheel (the module itself imports the whole engine): given an object with the
    `DiffusionOutput` fields it reads, the `multimodal_output["metadata"]["stream"]` it formats."""
    member = "vllm_omni/diffusion/output_formatter.py"
    tree = ast.parse(wheel_source(member, wheel))
    (node,) = [
        n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_stream_metadata_from_diffusion_output"
    ]
    namespace: dict[str, Any] = {"cast": cast, "DiffusionMetadata": dict, "DiffusionOutput": Any}
    exec(compile(ast.Module(body=[node], type_ignores=[]), f"{wheel or wheel_path()}!{member}", "exec"), namespace)
    return cast(Callable[[Any], "dict[str, Any] | None"], namespace[node.name])


def _package(name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__path__ = []  # a package, so submodules resolve through sys.modules
    return module


def _module(name: str, **attrs: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    return module
