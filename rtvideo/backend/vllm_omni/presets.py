"""What a vLLM-Omni model runs with when a start asks nothing else: its real-time preset and the
request-frame cap that bounds its GPU memory, both read from the model rule table
(`model_rules.py`). The loader's settings (`loading/settings.py`) and the engine's source
(`source.py`) read them here; the generator catalog (`backend/catalog.py`) stays free of the
engine's facts so that it can sit below both generators."""

from __future__ import annotations

import copy
from typing import Any

from rtvideo.backend.vllm_omni import model_rules

#: vLLM-Omni engine model id → its real-time preset: sampling fields (`start_request.SAMPLING_FIELDS`)
#: and `extra_params` (the engine's `extra_args`), from the model rule table
#: (`vllm_omni/model_rules.py`). Used when the deployer sets no `vllm_omni_extra_params`
#: ("auto"); a start's own values are merged over it. Helios-Distilled: vLLM-Omni's streaming
#: example runs it this way; without it Helios runs stage 1 only, 50 steps, guidance 5.0.
VLLM_OMNI_PRESETS: dict[str, dict[str, Any]] = {
    model_id: rules.preset_copy() for rules in model_rules.MODELS for model_id in rules.model_ids
}


def vllm_omni_preset(model: str, rules: model_rules.ModelRules | None = None) -> dict[str, Any]:
    """A copy of the preset of `rules`, else of `model` (`{"extra_params": {}}` for a model without one)."""
    if rules is not None:
        return rules.preset_copy()
    preset = copy.deepcopy(VLLM_OMNI_PRESETS.get(model, {}))
    preset.setdefault("extra_params", {})
    return preset


# --- GPU memory of one vLLM-Omni engine request (docs/vllm-omni.md, "GPU memory") -------------
#: In step mode Helios keeps every decoded frame of a request on the GPU (`history_video`, the
#: VAE's float32 output, concatenated each chunk: pipeline_helios.py), so one request holds
#: width x height x 3 channels x 4 bytes per frame for all its frames until it ends, and twice
#: that while a chunk is concatenated (`model_rules.MemoryRule.DECODED_HISTORY`).
HELIOS_WIDTH, HELIOS_HEIGHT = 640, 384
#: 2,949,120 bytes (2.8 MiB) per 640x384 frame
HELIOS_FRAME_BYTES = HELIOS_WIDTH * HELIOS_HEIGHT * model_rules.FLOAT32_RGB_BYTES
#: `vllm_omni_max_request_frames` by default: a peak of 8 GiB / (2 x 2,949,120 B) = 1456 frames,
#: cut to whole 33-frame chunks (a Helios request runs whole chunks): 44 chunks, 1452 frames
#: (90.75 s at 16 fps; 4 GiB of history held, 8 GiB at its peak)
DEFAULT_MAX_REQUEST_FRAMES = model_rules.HELIOS_DISTILLED.history_cap(HELIOS_WIDTH, HELIOS_HEIGHT)
