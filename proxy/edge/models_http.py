"""`GET /v1/models`: the model names a start may ask for, in the OpenAI list format (as vLLM's
server answers it), each with what it takes and what it measured of itself
(docs/operations.md, docs/serving.md).

One responsibility: read, on each request, what the Triton endpoints not known to be down say of
their model (its config's parameters, as the model reads them: `BackendSettings`; its last
answered health probe: `endpoint_capacity`) and list it. Nothing is cached and nothing is
written: the listing is what the endpoints say now. Invariants: each served name once, in the
order the endpoints give them, the first the one `video.start` reports; an endpoint whose
config cannot be read adds nothing (logged at INFO) and holds the answer up by one probe timeout
at most; behind the token when one is set; 503 when no endpoint's config could be read.
`/healthz` lists the same names (`served_model_names`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from rtvideo.proxy.edge.access import refused_without_token
from rtvideo.proxy.edge.json_reply import JsonHandler
from rtvideo.proxy.edge.socket import ProxyContext
from rtvideo.proxy.placement.supervisor import BackendState

log = logging.getLogger(__name__)

#: `created` of every model in `GET /v1/models`: when this proxy process started (vLLM's is the request's time)
STARTED_AT = int(time.time())


async def served_models(context: ProxyContext) -> dict[str, dict[str, Any]]:
    """The model names a start may ask for (`--served-model-name`, else the Triton model's name
    and its generator's model ids), each with what `/v1/models` says of it: the interactions it
    takes (`interactions`, as `video.start` `config.interactions`) and the deployed model's own
    rules as `config.model_rules` states them (`model_rules`, when it has any), read from the
    model configs of the Triton endpoints as the model reads them (`BackendSettings`); and, from
    every endpoint that serves the name, what its model measured of itself (`endpoint_capacity`):
    `realtime_capacity_fps` is their sum (None while none has a figure), `endpoints` each one's.
    In order, each once. Empty when no endpoint's config could be read."""
    from rtvideo.backend.loading.settings import BackendSettings  # torch-free, like the proxy

    model = context.settings.model

    async def read(endpoint: Any) -> tuple[tuple[str, ...], dict[str, Any]]:
        try:
            response = await endpoint.bridge.client.get_model_config(
                model, headers=endpoint.bridge.headers, client_timeout=context.settings.probe_timeout
            )
            params = {key: value.string_value for key, value in response.config.parameters.items()}
            settings = BackendSettings.from_parameters(params)
            rules = settings.model_rules()
            card = {"interactions": settings.interactions().describe()}
            if rules is not None:
                card["model_rules"] = rules.describe()
            return settings.served_names(model), card
        except Exception as exc:  # noqa: BLE001 - that endpoint is down or its config unusable: the others say
            log.info("triton endpoint %s: served model names not read (%s)", endpoint.address, exc)
            return (), {}

    # every endpoint not known to be down, at once (a hung one holds the answer up by one timeout at most)
    up = [
        e
        for e in context.pool.endpoints.values()
        if e.supervisor.state not in (BackendState.DOWN, BackendState.RESTARTING)
    ]
    models: dict[str, dict[str, Any]] = {}
    for endpoint, (served, card) in zip(up, await asyncio.gather(*(read(e) for e in up)), strict=True):
        measured = endpoint_capacity(endpoint)
        for name in served:
            entry = models.setdefault(name, {**card, "realtime_capacity_fps": None, "endpoints": []})
            entry["endpoints"].append(measured)
            if measured["realtime_capacity_fps"] is not None:
                entry["realtime_capacity_fps"] = (entry["realtime_capacity_fps"] or 0) + measured[
                    "realtime_capacity_fps"
                ]
    return models


def endpoint_capacity(endpoint: Any) -> dict[str, Any]:
    """What the model at `endpoint` said of itself in its last answered health probe (its pong's
    `model`, docs/protocol.md §8): frames per second it delivers in real time at its default size
    (measured by the model: `realtime_capacity_fps`, None until it has a figure), how much of it
    its live sessions take, and its session limit and why (`max_sessions_reason`)."""
    status = endpoint.bridge.model_status or {}
    return {
        "endpoint": endpoint.address,
        "realtime_capacity_fps": status.get("realtime_capacity_fps"),
        "realtime_capacity_from": status.get("realtime_capacity_from"),
        "realtime_load_fps": status.get("realtime_load_fps"),
        "max_sessions": status.get("max_sessions"),
        "max_sessions_reason": status.get("max_sessions_reason"),
        "sessions": status.get("sessions"),
    }


async def served_model_names(context: ProxyContext) -> list[str]:
    """`served_models`' names, in order."""
    return list(await served_models(context))


class ModelsHandler(JsonHandler):
    """`GET /v1/models` in the OpenAI list format (as vLLM's server answers it): the served model
    names, the first the one `video.start` reports, each with `interactions` (the kinds, event
    fields and interpolations it takes), `model_rules` (sizes, fps, interaction kinds, whether
    a first frame is required) when the model has rules of its own, and `realtime_capacity_fps`
    with `endpoints` (`served_models`). Behind the token when one is set; 503 when
    no Triton endpoint's model config could be read."""

    async def get(self) -> None:
        ctx = self.context
        if refused_without_token(self, ctx.settings.token):
            return
        models = await served_models(ctx)
        root = next(iter(models), None)
        data = [
            {
                "id": name,
                "object": "model",
                "created": STARTED_AT,
                "owned_by": "rtvideo",
                "root": root,
                "parent": None,
                **card,
            }
            for name, card in models.items()
        ]
        self.reply(bool(models), {"object": "list", "data": data})
