"""One owner for "why is this interaction refused": the same refused interaction sent through the
proxy (a WebSocket client, the real Tornado proxy) and over direct gRPC (tritonclient's stream,
`rtvideo.client.triton_stream`) to a real tritonserver gets the same error, code and message,
and they are what `rtvideo.core.interaction.refusal.interaction_refusal` returns for the model's own
settings (its `config.pbtxt` parameters).

The built-in generator and the vLLM-Omni generator (the stand-in engine, tests/support/omni_standin.py,
whose refusals tests/unit/backend/test_vllm_omni_refusals.py reads against the wheel): a field no
model applies, a modality the generator does not register, a blend the engine does not take, a
modality the engine's pipeline has no handler for.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rtvideo.backend.loading.settings import BackendSettings
from rtvideo.client.triton_stream import TritonStreamSession
from rtvideo.core.interaction.parse import parse_interaction
from rtvideo.core.interaction.refusal import interaction_refusal
from rtvideo.triton.model_repo import read_parameters
from tests.support.omni_triton import MODEL, NO_PROMPT
from tests.support.proxy_client import Ws, is_error, ws
from tests.support.proxy_host import run
from tests.support.streams import FAST_MODEL

VELOCITY = {"mode": "velocity", "data": {"translation": [0.0, 0.0, 0.05], "rotation": [0.0, 0.0, 0.0, 1.0]}}
BLEND = [{"text": "a reef", "weight": 1}, {"text": "a desert", "weight": 2}]
KEYS = ("type", "code", "message", "event_id")


def expected(model_dir: Path, interactions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the core function says of each, with the capabilities and pipeline rules the model's
    settings give it."""
    settings = BackendSettings.from_parameters(read_parameters(model_dir))
    out = []
    for interaction in interactions:
        request = parse_interaction({"interaction": interaction})
        refusal = interaction_refusal(request, settings.interactions(), settings.pipeline_interactions())
        assert refusal is not None, interaction
        out.append(
            {"type": "error", "code": refusal.code.value, "message": refusal.message, "event_id": request.event_id}
        )
    return out


def through_the_proxy(url: str, interactions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    async def body() -> list[dict[str, Any]]:
        async with ws(url) as conn:
            s = Ws(conn)
            await s.start("a harbour")
            errors = []
            for interaction in interactions:
                await s.send({"type": "session.interaction", "interaction": interaction})
                errors.append(await s.until(is_error("interaction_failed")))
            await s.send({"type": "session.stop"})
            await s.finish()
        return errors

    return [{key: error.get(key) for key in KEYS} for error in run(body())]


def over_grpc(grpc_url: str, model: str, interactions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    errors = []
    with TritonStreamSession(grpc_url, model) as s:
        s.start("a harbour")
        for interaction in interactions:
            s.send({"type": "session.interaction", "interaction": interaction})
            deadline = time.monotonic() + 30
            while True:
                message = s.next(max(0.01, deadline - time.monotonic())).message or {}
                if message.get("type") == "error":
                    assert message.get("code") == "interaction_failed", message  # nothing else goes wrong
                    errors.append({key: message.get(key) for key in KEYS})
                    break
    return errors


def test_the_builtin_generator_refuses_the_same_way_through_the_proxy_and_over_grpc(triton, proxies) -> None:
    interactions = [
        {"event_id": "refused-field", "event": {"prompt": "p", "negative_prompt": "blur"}},
        {"event_id": "refused-image", "event": {"multi_modal_data": {"image": {"url": "https://example.com/a.png"}}}},
    ]
    want = expected(Path(triton.config.model_repository) / FAST_MODEL, interactions)
    assert "negative_prompt" in want[0]["message"] and "'image'" in want[1]["message"]
    assert through_the_proxy(proxies.url(), interactions) == want
    assert over_grpc(triton.grpc_url, FAST_MODEL, interactions) == want


def test_the_vllm_omni_generator_refuses_the_same_way_through_the_proxy_and_over_grpc(omni) -> None:
    proxies, engines = omni
    for model, interactions in (
        (
            MODEL,  # Helios: prompt only, linearly
            [
                {"event_id": "refused-camera", "event": {"multi_modal_data": {"camera": VELOCITY}}},
                {"event_id": "refused-blend", "event": {"prompts": BLEND}},
            ],
        ),
        (NO_PROMPT, [{"event_id": "refused-prompt", "event": {"prompt": "a new prompt"}}]),  # no handler at all
    ):
        want = expected(engines[model].record.parent / model, interactions)
        assert through_the_proxy(proxies.url(model=model), interactions) == want
        assert over_grpc(proxies.triton_url, model, interactions) == want
        # none of them reached the engine
        assert not [c for c in engines[model].calls("submit") if c["event_id"] in {i["event_id"] for i in interactions}]
    assert (
        "'camera' is not supported by pipeline 'HeliosPyramidPipeline'"
        in expected(
            engines[MODEL].record.parent / MODEL,
            [{"event_id": "c", "event": {"multi_modal_data": {"camera": VELOCITY}}}],
        )[0]["message"]
    )
