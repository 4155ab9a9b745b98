"""A real tritonserver hosting generator=vllm_omni models with the STAND-IN engine
(`tests/support/omni_standin.py`, named by the `vllm_omni_engine` parameter and imported from
this checkout: `tests_importable`), one model per pipeline class, and proxies for it (`ProxyHost`)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rtvideo.backend.vllm_omni.model_rules import LINGBOT_WORLD
from rtvideo.triton.model_repo import derive_model
from tests.support.paths import STANDIN_ENGINE, tests_importable
from tests.support.proxy_host import ProxyHost

#: a 1x1 PNG as a start's image_reference
PIXEL = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC"
)
MODEL, DYING = "omni_video", "omni_video_dies"
#: a model whose pipeline class has no prompt handler in vLLM-Omni's registry (a Wan-like one)
NO_PROMPT = "omni_video_no_prompt"
#: LingBot-World (its rules: 832x480 only, a first frame on every request, 4 steps)
LINGBOT = "omni_lingbot"
#: Helios (not distilled): sides on a 16-pixel grid
HELIOS_BASE = "omni_helios"
#: an engine that runs one request at a time (vLLM-Omni's default max_num_seqs), max_sessions auto
ONE_REQUEST = "omni_one_request"
PIPELINES = {
    MODEL: "HeliosPyramidPipeline",
    HELIOS_BASE: "HeliosPipeline",
    DYING: "HeliosPyramidPipeline",
    NO_PROMPT: "WanPipeline",
    LINGBOT: "LingBotWorldCausalDMDPipeline",
    ONE_REQUEST: "HeliosPyramidPipeline",
}
#: the built-in generator with its real-time capacity set low (two 64x64 sessions at 16 fps fit,
#: a third does not), beside the stand-in models in the same tritonserver
CAPPED = "builtin_capped"
CAPPED_FPS = 40
W, H, FPC = 128, 128, 4
#: each model's default size: its own rules' where it has any
SIZES = {LINGBOT: (832, 480)}
PRESET = {"is_enable_stage2": True, "pyramid_num_inference_steps_list": [2, 2, 2]}


class Engine:
    """One model's stand-in engine, seen through its record file."""

    def __init__(self, record: Path) -> None:
        self.record = record

    def calls(self, call: str | None = None, **match: Any) -> list[dict[str, Any]]:
        if not self.record.exists():
            return []
        rows = [json.loads(line) for line in self.record.read_text().splitlines() if line.strip()]
        return [r for r in rows if (call is None or r["call"] == call) and all(r.get(k) == v for k, v in match.items())]

    def wait_for(self, call: str, timeout: float = 15.0, **match: Any) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while not (found := self.calls(call, **match)):
            assert time.monotonic() < deadline, f"the engine never got {call} {match}: {self.calls()}"
            time.sleep(0.05)
        return found[0]


def derive_models(repo: Path, names: Iterable[str] = PIPELINES) -> dict[str, Engine]:
    """The stand-in models `names` (of PIPELINES) in `repo`, each with the engine that records its calls."""
    engines = {}
    for name in names:
        record = repo / f"{name}.calls.jsonl"
        engines[name] = Engine(record)
        one = name == ONE_REQUEST
        engine_args = {
            "record": str(record),
            # LingBot-World yields its own chunks (9 frames, then 12), as its pipeline does
            **({} if name == LINGBOT else {"frames_per_chunk": FPC}),
            "chunk_seconds": 0.05,
            "first_chunk_seconds": 0.8,
            "model_class_name": PIPELINES[name],
            # four requests at once (the tests run sessions side by side); ONE_REQUEST: the default, 1
            **({} if one else {"max_num_seqs": 4}),
        }
        derive_model(
            repo,
            name,
            {
                "generator": "vllm_omni",
                "width": str(SIZES.get(name, (W, H))[0]),
                "height": str(SIZES.get(name, (W, H))[1]),
                "fps": "16",
                "frames_per_chunk": str(LINGBOT_WORLD.frames_per_chunk if name == LINGBOT else FPC),
                "default_transition_chunks": "2",
                # ONE_REQUEST: auto, the engine's max_num_seqs
                **({} if one else {"max_sessions": "4"}),
                # the stand-in's pace on a loaded machine is no capacity: measured and shown, never refusing
                "realtime_capacity_fps": "off",
                "vllm_omni_engine": STANDIN_ENGINE,
                "vllm_omni_engine_args": json.dumps(engine_args),
                "vllm_omni_extra_params": "auto" if name in (LINGBOT, HELIOS_BASE) else json.dumps(PRESET),
                "vllm_omni_health_seconds": "0.2",
            },
        )
    return engines


def serve_omni(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ProxyHost, dict[str, Engine]]]:
    """A real tritonserver with one stand-in model per entry of PIPELINES and the built-in CAPPED
    model, and proxies for it: the `omni` fixture of tests/e2e/conftest.py (one per test package)."""
    from rtvideo.triton.command import TritonConfig
    from rtvideo.triton.server import TritonServer, free_port

    repo = tmp_path_factory.mktemp("omni_repository")
    engines = derive_models(repo)
    derive_model(
        repo,
        CAPPED,
        {"width": "64", "height": "64", "render_workers": "0", "realtime_capacity_fps": str(CAPPED_FPS)},
    )
    log = Path(os.environ.get("RTVIDEO_TEST_TRITON_LOG", str(repo / "triton.log")))
    server = TritonServer(
        TritonConfig(
            model_repository=repo,
            grpc_port=free_port(),
            http_port=free_port(),
            metrics_port=free_port(),
            environment=tests_importable(),
        ),
        stdout=log,
    )
    server.start(timeout=300)
    host = ProxyHost(server.grpc_url)
    try:
        yield host, engines
    finally:
        host.close()
        server.stop()
