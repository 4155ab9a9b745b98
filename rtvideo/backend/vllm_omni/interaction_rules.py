"""Which pipeline class the deployed vLLM-Omni model runs, and what its deploy config sets.

vLLM-Omni's rules about interactions are keyed by the pipeline class (its handler registry,
`STRUCTURED_HANDLER_REGISTRY`), as are its models' other rules (`model_rules.py`):
`pipeline_class` finds the class the engine will resolve, and the `deploy_*` readers the deploy
config's stages. Whether an interaction is refused is decided by the model's admission, with the
table's data (`model_rules.pipeline_interactions`, `rtvideo.core.interaction.refusal`), before
the engine sees it: the engine's own refusals come back through `generate()`, which aborts the
request (`orchestrator.py` `_handle_interaction`, `async_omni.py`).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def pipeline_class(model: str, engine_args: Mapping[str, Any]) -> str | None:
    """The pipeline class vLLM-Omni resolves for `model` (`OmniDiffusionConfig.model_class_name`):
    the `model_class_name` engine argument, else the deploy config's (`deploy_config`: its first
    stage's `model_class_name`, which the engine applies over the model directory's), else
    `_class_name` of the model's `model_index.json` (a local directory, or the Hugging Face
    cache); None when it cannot be known here."""
    given = engine_args.get("model_class_name")
    if isinstance(given, str) and given:
        return given
    deployed = deploy_config_class(engine_args.get("deploy_config"))
    if deployed is not None:
        return deployed
    index: Path | None = Path(model) / "model_index.json" if model else None
    if index is None or not index.is_file():
        index = None
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(model, "model_index.json")
            if isinstance(cached, str):
                index = Path(cached)
        except Exception:  # noqa: BLE001 - no hub client or not a repo id: unknown
            index = None
    if index is None:
        return None
    try:
        name = json.loads(index.read_text()).get("_class_name")
    except (OSError, ValueError, AttributeError):
        return None
    return name if isinstance(name, str) and name else None


def _deploy_stages(path: Any) -> tuple[dict[str, Any], ...]:
    """The stages of a vLLM-Omni deploy YAML; () for no path, an unreadable file or no stages
    (a malformed file is the engine's to report). Read once per version of the file: the
    model's settings ask for it several times at load."""
    if not isinstance(path, str) or not path:
        return ()
    try:
        stat = Path(path).stat()
    except OSError:
        return ()
    return _read_stages(path, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=8)
def _read_stages(path: str, mtime_ns: int, size: int) -> tuple[dict[str, Any], ...]:
    """`_deploy_stages` of one version of the file (its modification time and size are the key;
    callers only read what it returns)."""
    try:
        import yaml  # vllm-omni's own dependency: present wherever its deploy configs are read
    except ImportError:
        return ()
    try:
        config = yaml.safe_load(Path(path).read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return ()
    stages = config.get("stages") if isinstance(config, dict) else None
    return tuple(s for s in stages if isinstance(s, dict)) if isinstance(stages, list) else ()


def deploy_stage_value(path: Any, key: str) -> Any:
    """`key` of the first stage that sets it in a vLLM-Omni deploy YAML (a stage's own key, else
    its `engine_args`'), or None."""
    for stage in _deploy_stages(path):
        args = stage.get("engine_args")
        for place in (stage, args if isinstance(args, dict) else {}):
            if place.get(key) is not None:
                return place[key]
    return None


def deploy_config_class(path: Any) -> str | None:
    """`model_class_name` of the first stage that names one in a vLLM-Omni deploy YAML, or None."""
    for stage in _deploy_stages(path):
        name = stage.get("model_class_name")
        if isinstance(name, str) and name:
            return name
    return None


def deploy_model_config(path: Any) -> dict[str, Any]:
    """`model_config` of the first stage that has one in a vLLM-Omni deploy YAML, or {}: what the
    pipeline reads at load (LingBot-World sizes its AR cache from it)."""
    for stage in _deploy_stages(path):
        config = stage.get("model_config")
        if isinstance(config, dict):
            return config
    return {}
