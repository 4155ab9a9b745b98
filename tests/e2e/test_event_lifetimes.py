"""Randomised steering of the built-in generator, through the proxy and over direct gRPC: on
every chunk, started and completed events are active, each event starts and ends once and is
active without a gap from its start to its end, and never listed after it (docs/protocol.md
§6); every acked event reaches exactly one end. The vLLM-Omni generator's runs are in
test_vllm_omni_backend.py."""

from __future__ import annotations

import asyncio

import pytest

from rtvideo.client.triton_stream import TritonStreamSession
from tests.support.proxy_client import Ws, ws
from tests.support.steering_script import check_steered, random_script, run_over_grpc, run_through_proxy
from tests.support.streams import FAST_MODEL

KINDS = ("prompt", "target", "velocity", "home")


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_prompt_and_camera_steering_through_the_proxy(proxies, seed: int) -> None:
    script = random_script(seed, KINDS, steps=12)

    async def body():  # type: ignore[no-untyped-def]
        async with ws(proxies.url()) as conn:
            s = Ws(conn)
            await s.start("a harbour", seed=seed)
            return await run_through_proxy(s, script, settle=1.0)

    figures = check_steered(asyncio.run(asyncio.wait_for(body(), 300)), script)

    assert figures["chunks"] >= 2, figures


@pytest.mark.parametrize("seed", [4, 5])
def test_random_prompt_and_camera_steering_over_grpc(triton, seed: int) -> None:
    script = random_script(seed, KINDS, steps=12)
    with TritonStreamSession(triton.grpc_url, FAST_MODEL) as s:
        s.start("a harbour", seed=seed)
        figures = check_steered(run_over_grpc(s, script, settle=1.0), script)

    assert figures["chunks"] >= 2, figures
