"""What vLLM-Omni 0.30 refuses of an interaction, checked before it is forwarded.

`AsyncOmni.submit_interaction_async` refuses synchronously (raises) only an empty prompt, a
negative `transition_chunks`, a pipeline that is not single-stage diffusion, and no (or more
than one) active request of that id; everything else only queues. The worker refuses later
(`DiffusionModelRunner.submit_interaction` → `InteractionCoordinator.enqueue_parts` →
`PromptInteractionHandler.validate_payload`): a modality the pipeline class has no handler
for in `STRUCTURED_HANDLER_REGISTRY` (`diffusion/interaction/registry.py`), a request whose
prompt is not yet encoded ("not allowed before initial generation has started"), an empty
prompt or event id, a negative `transition_chunks`, or the pipeline's `encode_prompt` failing.
Those come back as a non-fatal `ErrorMessage` that `generate()` raises, and the request is
aborted (`orchestrator.py` `_handle_interaction`, `async_omni_base.py`, `async_omni.py`).

So the adapter checks every one of those rules it can know beforehand (`refusal`), and holds
events until the request's first output (the prompt is encoded before it); what only the
engine can detect ends the session.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rtvideo.core.interaction import kinds_of

#: `vllm_omni.diffusion.interaction.registry.STRUCTURED_HANDLER_REGISTRY` of the pinned wheel:
#: pipeline class -> the interaction modalities it has a handler for (a unit test compares it)
INTERACTION_MODALITIES: dict[str, frozenset[str]] = {
    "HeliosPipeline": frozenset({"prompt"}),
    "HeliosPyramidPipeline": frozenset({"prompt"}),
    "LingBotWorldCausalDMDPipeline": frozenset({"camera"}),
}


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


def modalities(pipeline: str | None) -> frozenset[str] | None:
    """The modalities the engine accepts for `pipeline` (None: unknown, nothing is checked)."""
    if pipeline is None:
        return None
    return INTERACTION_MODALITIES.get(pipeline, frozenset())


def refusal(event: Mapping[str, Any], transition_chunks: int | None, pipeline: str | None) -> str | None:
    """Why the engine would refuse this interaction (its own message), or None."""
    prompt = event.get("prompt")
    if "prompt" in event and (not isinstance(prompt, str) or not prompt):
        return "prompt must be non-empty"
    if transition_chunks is not None and transition_chunks < 0:
        return "transition_chunks must be >= 0"
    accepted = modalities(pipeline)
    if accepted is not None:
        parts = kinds_of(event)
        if not parts:
            return "interaction event requires prompt and/or multi_modal_data"
        for modality in parts:
            if modality not in accepted:
                return f"interaction modality {modality!r} is not supported by pipeline {pipeline!r}"
    return None
