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
tests/unit/backend/test_realtime_capacity.py).

That number is only reached by requests that batch. In step mode the scheduler admits a waiting
request beside a running one only when their batching keys are equal (`_can_schedule_waiting`
in `diffusion/sched/base_scheduler.py`; the key is `StepBatchSamplingParamsKey` in `sched/
interface.py`: size, `num_frames`, fps, guidance, LoRA, ...); otherwise it waits, silently, until
the running one ends, which for a streaming session is the session's end. So `max_sessions: auto`
follows `max_num_seqs` only where every session shares that key (`batching_fields` lists the
fields a session here may set for itself) and is 1 otherwise, with the reason (`SessionLimit`).
Here each start asks its own length (`num_frames`, `EngineSources.engine_frames`), so `auto` is 1
whatever `max_num_seqs` is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rtvideo.backend.vllm_omni import interaction_rules
from rtvideo.core.session_config import ModelCapabilities

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


#: the guidance fields of the batching key a start may set (`start_request.SAMPLING_FIELDS` names)
_GUIDANCE = frozenset({"guidance_scale", "guidance_scale_2", "true_cfg_scale", "boundary_ratio"})


@dataclass(frozen=True)
class SessionLimit:
    """The model's session limit and why it is that number (the load log, `GET /v1/models`)."""

    sessions: int
    reason: str


def batching_fields(caps: ModelCapabilities) -> tuple[str, ...]:
    """The fields of the engine's batching key that sessions of a model with `caps` may set each
    for itself, so that two sessions may not batch: `num_frames` always (a start asks its own
    length), the size and fps where the limits allow more than one, guidance where the generator
    takes a start's guidance, LoRA where it takes a start's `lora`."""
    fields = ["num_frames"]
    if caps.limits.min_side < caps.limits.max_side:
        fields.append("width/height")
    if caps.limits.max_fps > 1:
        fields.append("fps")
    if caps.sampling_fields & _GUIDANCE:
        fields.append("guidance")
    if "lora" in caps.start_fields:
        fields.append("lora")
    return tuple(fields)


def engine_session_limit(
    max_num_seqs: int, max_num_seqs_from: str, varying: tuple[str, ...], explicit: int | None
) -> SessionLimit:
    """The session limit of a model whose engine runs `max_num_seqs` requests at once: the
    deployer's number (`explicit`, already checked not above `max_num_seqs`), else `max_num_seqs`
    where no session may differ from another in the batching key (`varying` empty), else 1."""
    engine = f"the engine's max_num_seqs={max_num_seqs} ({max_num_seqs_from or 'the engine'})"
    differ = ", ".join(varying)
    if explicit is not None:
        reason = f"max_sessions={explicit} set by the deployer; {engine}"
        if explicit > 1 and varying:
            reason += (
                f"; sessions that differ in {differ} do not batch and wait inside the engine "
                "for one another (vLLM-Omni's step scheduler batches only equal keys)"
            )
        return SessionLimit(explicit, reason)
    if max_num_seqs == 1:
        return SessionLimit(1, f"auto: {engine}, one request at a time")
    if varying:
        return SessionLimit(
            1,
            f"auto: 1, although {engine}: vLLM-Omni's step scheduler runs requests together only "
            f"when their batching keys are equal, and sessions here may differ in {differ}, so a "
            "second session would wait inside the engine without server_busy",
        )
    return SessionLimit(max_num_seqs, f"auto: {engine}; every session shares the engine's batching key")
