"""How many requests the hosted engine runs at once: the model's session limit.

vLLM-Omni's diffusion scheduler runs at most `max_num_seqs` requests (`diffusion/sched/
base_scheduler.py`: `max_num_running_reqs`); a request beyond waits inside the engine, silently,
until one ends. A session is one request, so a session beyond that number would wait with no
`server_busy` and be ended by the stall timeout. The model therefore holds no more sessions
than the engine runs (`BackendSettings.session_limit`).

The number as the engine has it: its diffusion config (`AsyncOmni.get_diffusion_od_config()`,
the inline worker's `OmniDiffusionConfig`); where the engine does not expose it (an
out-of-process stage), what it was built from: the `max_num_seqs` engine argument (or its
legacy name `max_batch_size`), else the deploy config's stage, else the wheel's default
(`OmniDiffusionConfig.max_num_seqs`, 1 in 0.30.0: `diffusion/data.py`, checked by
tests/unit/backend/test_vllm_omni_engine_limits.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rtvideo.backend.vllm_omni import interaction_rules

#: `OmniDiffusionConfig.max_num_seqs` of the pinned wheel (`vllm_omni/diffusion/data.py`)
WHEEL_DEFAULT_MAX_NUM_SEQS = 1
#: engine arguments that set it (`data.py` moves the legacy name onto the canonical one)
_ARG_NAMES = ("max_num_seqs", "max_batch_size")


def _positive(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def configured_max_num_seqs(engine_args: Mapping[str, Any]) -> tuple[int, str]:
    """What the engine is built with, and where that comes from (for the load's message)."""
    for name in _ARG_NAMES:
        value = _positive(engine_args.get(name))
        if value is not None:
            return value, f"the engine argument {name}"
    deploy = engine_args.get("deploy_config")
    for name in _ARG_NAMES:
        value = _positive(interaction_rules.deploy_stage_value(deploy, name))
        if value is not None:
            return value, f"the deploy config's {name} ({deploy})"
    return WHEEL_DEFAULT_MAX_NUM_SEQS, "vLLM-Omni's default"


def engine_max_num_seqs(od_config: Any, engine_args: Mapping[str, Any]) -> tuple[int, str]:
    """The effective `max_num_seqs` of a running engine, whose diffusion config is `od_config`
    (None when it has none to give), and where it was read."""
    value = _positive(getattr(od_config, "max_num_seqs", None))
    if value is not None:
        return value, "the engine's diffusion config"
    return configured_max_num_seqs(engine_args)
