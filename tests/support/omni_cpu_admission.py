"""Admission against vLLM-Omni 0.30's REAL engine on a CPU, for
tests/unit/backend/test_vllm_omni_real_engine_admission_cpu.py (issue 47 items 1 and 2).

Runs only in an interpreter with vllm 0.30 and vllm-omni 0.30 (the environment
scripts/test_real_engine.sh builds):

    python -m tests.support.omni_cpu_admission OUT.json

Writes the tiny random Helios of tests/support/omni_cpu.py, loads the model as the Triton model
does (`build_manager`: `EngineHost` on `AsyncOmni`, the pipeline profiler on, the session limit
from the engine), with a `RealtimeCapacity` of its own passed in (the composition root's seam).
One session runs; then an unlucky slow figure is measured into that capacity through its public
`observe` (what the engine host calls each chunk), far below one session's fps; then a second
start. Writes what it saw: the pong's model status, each output's stage-time keys as the
adapter received them, the figures, and each session's message types.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # `rtvideo` and `tests` from this checkout

from tests.support.omni_cpu import patch_cpu_platform, write_tiny_helios  # after the checkout is on the path

SIZE, FRAMES_PER_CHUNK, FPS = 128, 33, 16
#: what every output carried to the adapter: its `stage_durations` keys and values (seconds)
SEEN_DURATIONS: list[dict[str, float]] = []


def recording_engine(**kwargs: Any) -> Any:
    """The real `AsyncOmni`, recording each output's `stage_durations` as it leaves `generate()`
    (the `vllm_omni_engine` factory the settings name: `module:callable`)."""
    from vllm_omni import AsyncOmni

    class RecordingAsyncOmni(AsyncOmni):
        async def generate(self, *args: Any, **kw: Any) -> Any:
            async for output in super().generate(*args, **kw):
                if getattr(output, "images", None):
                    SEEN_DURATIONS.append(dict(getattr(output, "stage_durations", None) or {}))
                yield output

    return RecordingAsyncOmni(**kwargs)


def _session(manager: Any, corrid: int, num_frames: int) -> list[str]:
    from tests.support.recorder import Recorder
    from tests.support.runtime_standins import SECRET

    channel = Recorder()
    start = {"type": "session.start", "prompt": "a harbour at dawn", "num_frames": num_frames, "fps": FPS, "seed": 3}
    manager.on_request(corrid, json.dumps(start).encode(), start=True, end=False, channel=channel, secret=SECRET)
    if not channel.finished.wait(900):
        raise TimeoutError(f"session {corrid} did not end: {channel.types()}")
    return channel.types()


def run(model: Path) -> dict[str, Any]:
    patch_cpu_platform()
    from rtvideo.backend.loading.assembly import build_manager
    from rtvideo.backend.loading.settings import BackendSettings
    from rtvideo.backend.runtime.capacity import RealtimeCapacity

    settings = BackendSettings.from_parameters(
        {
            "generator": "vllm_omni",
            "vllm_omni_model": str(model),
            "vllm_omni_engine": "tests.support.omni_cpu_admission:recording_engine",
            "vllm_omni_engine_args": json.dumps({"enforce_eager": True}),
            "width": str(SIZE),
            "height": str(SIZE),
            "fps": str(FPS),
            "frames_per_chunk": str(FRAMES_PER_CHUNK),
            "pacing_lead_chunks": "off",
        }
    )
    capacity = RealtimeCapacity(SIZE, SIZE, settings.capacity_setting())
    manager = build_manager(settings, "tiny-helios", capacity=capacity)
    try:
        status_at_load = manager.status()
        first = _session(manager, 1, 3 * FRAMES_PER_CHUNK)  # three chunks: two timed
        measured = capacity.describe()
        for _ in range(8):  # an unlucky slow figure: a stalled host, a compile (0.01 fps)
            capacity.observe(1, 100.0, SIZE, SIZE, 1)
        slow = capacity.describe()
        second = _session(manager, 2, FRAMES_PER_CHUNK)
        after = capacity.describe()
    finally:
        manager.shutdown()
    return {
        "status_at_load": status_at_load,
        "first": first,
        "measured": measured,
        "slow": slow,
        "second": second,
        "after": after,
        "durations": SEEN_DURATIONS,
    }


def main() -> None:
    out = Path(sys.argv[1])
    # run as `-m`, this file is `__main__`; the engine factory is imported by name, so the named
    # module holds what the engine recorded: run that one's `run`
    from tests.support import omni_cpu_admission

    with tempfile.TemporaryDirectory(prefix="tiny-helios-") as tmp:
        result = omni_cpu_admission.run(write_tiny_helios(Path(tmp) / "model"))
    out.write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
