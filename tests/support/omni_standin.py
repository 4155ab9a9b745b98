"""A STAND-IN for vLLM-Omni's `AsyncOmni`, for tests on machines without a GPU or vLLM.

It implements only what `rtvideo/backend/vllm_omni/` calls (`tests/unit/backend/test_vllm_omni_api.py`
checks that list against the real class) and behaves like the real engine where the
adapter depends on it:

- `generate` streams one output per chunk: `multimodal_output["video"]` (float RGB in
  [0, 1]) and `multimodal_output["metadata"]["stream"]` with the chunk's event ids;
- prompt interactions are applied at chunk boundaries by vLLM-Omni's *real*
  `PromptInteractionHandler`, loaded from the pinned wheel (`tests/support/vllm_omni_wheel.py`);
  each chunk's colour is the blended conditioning, so a transition is visible in the video;
- `submit_interaction_async` is refused before the request's first output (as vLLM-Omni
  does), for an unknown request, and for a prompt containing "stand-in: refuse" (an
  engine error about one event);
- a prompt containing "stand-in: die" kills the engine: outputs stop and `check_health`
  raises from then on.

The Triton model loads it through the `vllm_omni_engine` parameter
(`/path/to/tests/support/omni_standin.py:StandInAsyncOmni`); its engine arguments configure it:
`record` (a JSON-lines file of every call, for the test to read), `chunk_seconds`,
`first_chunk_seconds`, `frames_per_chunk`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # `tests` as a package, in Triton's stub too
from tests.support.vllm_omni_wheel import (  # noqa: E402
    Sampling,
    StepRequestState,
    load_prompt_handler,
)


@dataclass
class StandInSamplingParams:
    """The fields of `OmniDiffusionSamplingParams` the adapter sets."""

    width: int | None = None
    height: int | None = None
    num_frames: int = 1
    fps: float | None = None
    frame_rate: float | None = None
    seed: int | None = None
    extra_args: dict[str, Any] = field(default_factory=dict)


@dataclass
class StandInOutput:
    """The fields of `OmniRequestOutput` the adapter reads."""

    request_id: str
    multimodal_output: dict[str, Any]
    images: list[Any] = field(default_factory=list)
    error: str | None = None
    finished: bool = False


def colour(prompt: str) -> torch.Tensor:
    """A prompt's stand-in conditioning: an RGB colour from its hash."""
    digest = hashlib.sha256(prompt.encode()).digest()
    return torch.tensor([digest[0], digest[1], digest[2]], dtype=torch.float32) / 255.0


class StandInAsyncOmni:
    """STAND-IN engine (see the module docstring); never used outside tests."""

    def __init__(self, model: str = "", **kwargs: Any) -> None:
        self.model = model
        self.kwargs = kwargs
        self._record = kwargs.get("record")
        self._chunk_seconds = float(kwargs.get("chunk_seconds", 0.05))
        self._first_chunk_seconds = float(kwargs.get("first_chunk_seconds", self._chunk_seconds))
        self._frames_per_chunk = int(kwargs.get("frames_per_chunk", 33))
        self._handler = load_prompt_handler().PromptInteractionHandler(
            encode_prompt=lambda prompt, **_: (colour(prompt), None), device="cpu", dtype=torch.float32
        )
        self._states: dict[str, StepRequestState] = {}
        self._produced: set[str] = set()  # requests that have yielded an output
        self._dead = False
        self.default_sampling_params_list = [StandInSamplingParams()]
        self._log("init", model=model, kwargs={k: v for k, v in kwargs.items() if k != "record"})

    def _log(self, call: str, **fields: Any) -> None:
        if self._record:
            with open(self._record, "a") as f:
                f.write(json.dumps({"call": call, "t": time.monotonic(), **fields}) + "\n")

    async def generate(
        self,
        prompt: Any,
        sampling_params: Any = None,
        request_id: str = "",
        *,
        sampling_params_list: Any = None,
        **_: Any,
    ) -> AsyncIterator[StandInOutput]:
        (params,) = sampling_params_list
        self._log(
            "generate",
            request_id=request_id,
            prompt=prompt,
            width=params.width,
            height=params.height,
            num_frames=params.num_frames,
            fps=params.fps,
            seed=params.seed,
            extra_args=params.extra_args,
        )
        state = StepRequestState(request_id, Sampling(), prompt_embeds=colour(prompt["prompt"]))
        self._states[request_id] = state
        try:
            chunks = math.ceil(params.num_frames / self._frames_per_chunk)
            for index in range(chunks):
                await asyncio.sleep(self._first_chunk_seconds if index == 0 else self._chunk_seconds)
                while self._dead:  # a dead engine produces nothing more
                    await asyncio.sleep(3600)
                meta = {"started_event_ids": [], "active_event_ids": [], "completed_event_ids": []}
                if "prompt" in state.interaction_sessions:  # InteractionCoordinator's lazy rule
                    meta = self._handler.apply_at_chunk_boundary(state, boundary_at=time.monotonic()).as_dict()
                state.chunk_index = index
                rgb = state.prompt_embeds.clamp(0, 1).numpy()
                video = np.broadcast_to(rgb, (self._frames_per_chunk, params.height, params.width, 3)).copy()
                self._produced.add(request_id)
                yield StandInOutput(
                    request_id,
                    {"video": video, "metadata": {"stream": {"generation_chunk_index": index, **meta}}},
                    finished=index == chunks - 1,
                )
        finally:
            self._states.pop(request_id, None)
            self._produced.discard(request_id)

    async def submit_interaction_async(self, request_id: str, *, interaction: dict[str, Any]) -> None:
        prompt = interaction["event"]["prompt"]
        early = request_id not in self._produced
        self._log(
            "submit",
            request_id=request_id,
            event_id=interaction["event_id"],
            prompt=prompt,
            transition_chunks=interaction.get("transition_chunks"),
            before_first_output=early,
        )
        state = self._states.get(request_id)
        if state is None:
            raise ValueError(f"No active request for interaction: {request_id!r}")
        if early:
            raise ValueError("prompt_update is not allowed before initial generation has started")
        if "stand-in: refuse" in prompt:
            raise ValueError("stand-in engine refuses this event")
        if "stand-in: die" in prompt:
            self._dead = True
            return
        self._handler.enqueue(
            state,
            event_id=interaction["event_id"],
            received_at=time.monotonic(),
            payload={"prompt": prompt},
            transition_chunks=interaction.get("transition_chunks"),
        )

    async def abort(self, request_id: str, *, timeout: float | None = None) -> None:
        self._log("abort", request_id=request_id)

    async def check_health(self) -> None:
        if self._dead:
            raise RuntimeError("stand-in engine died")

    def shutdown(self, timeout: float | None = None) -> None:
        self._log("shutdown")
