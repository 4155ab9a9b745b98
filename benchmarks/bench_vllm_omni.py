"""One short generator=vllm_omni session through Triton, on a GPU: time to first chunk, generated fps.

Needs `tritonserver` (the NGC vLLM image has it on PATH), vLLM + vllm-omni, and the model's
weights already on disk (nothing is downloaded: HF_HUB_OFFLINE=1). Starts its own Triton
with the model derived for vllm_omni, runs one direct-gRPC session of `--chunks` chunks with
one prompt update after the first chunk, and prints the figures. Asserts nothing but the
protocol's stream rules.

    python3 benchmarks/bench_vllm_omni.py [--model BestWishYsh/Helios-Distilled --chunks 6]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from rtvideo.client.triton_stream import TritonStreamSession
from rtvideo.triton import TritonConfig, TritonServer, free_port
from rtvideo.triton.access import generate_key
from rtvideo.triton.model_repo import derive_model

#: vLLM-Omni's Helios-Distilled defaults (docs: 33 frames per chunk, 640x384, 16 fps)
HELIOS = {"width": "640", "height": "384", "fps": "16", "frames_per_chunk": "33"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=os.environ.get("HELIOS_MODEL", "BestWishYsh/Helios-Distilled"))
    parser.add_argument("--chunks", type=int, default=6, help="chunks in the session")
    parser.add_argument("--engine-args", default="{}", help="AsyncOmni engine arguments, JSON")
    parser.add_argument("--extra-params", default="{}", help="the model's preset extra_params, JSON")
    parser.add_argument("--log", type=Path, default=None, help="Triton's log (default: a temp file)")
    parser.add_argument(
        "--engine",
        default="vllm_omni:AsyncOmni",
        help="engine factory (a smoke test on CPU: tests/support/omni_standin.py:StandInAsyncOmni)",
    )
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    frames_per_chunk = int(HELIOS["frames_per_chunk"])
    with tempfile.TemporaryDirectory(prefix="rtvideo-omni-") as tmp:
        repo = Path(tmp)
        derive_model(
            repo,
            "realtime_video",
            {
                **HELIOS,
                "generator": "vllm_omni",
                "max_sessions": "1",
                "vllm_omni_model": args.model,
                "vllm_omni_engine_args": json.dumps(json.loads(args.engine_args)),
                "vllm_omni_extra_params": json.dumps(json.loads(args.extra_params)),
                "vllm_omni_engine": args.engine
                if args.engine.startswith("vllm_omni:")
                else f"{Path(args.engine.rpartition(':')[0]).resolve()}:{args.engine.rpartition(':')[2]}",
            },
        )
        key = generate_key()  # keyed as `rtvideo serve` keys its own Triton
        config = TritonConfig(repo, grpc_port=free_port(), http_port=free_port(), metrics_port=free_port(), key=key)
        t_load = time.perf_counter()
        with TritonServer(config, stdout=args.log or repo / "triton.log") as server:
            print(f"model loaded (engine start included) in {time.perf_counter() - t_load:.1f} s")
            with TritonStreamSession(server.grpc_url, key=key) as s:
                t0 = time.perf_counter()
                s.start(
                    "A quiet harbour at dawn, boats rocking gently", num_frames=args.chunks * frames_per_chunk, seed=7
                )
                chunks: list[tuple[float, dict]] = []
                update_sent = None
                for reply in s.until("session.done", timeout=900):
                    message = reply.message or {}
                    if message.get("type") == "video.chunk_metadata" and message["kind"] == "media":
                        chunks.append((reply.received, message))
                        if update_sent is None:
                            s.interact(
                                "A snowy street illuminated by warm lanterns", event_id="update", transition_chunks=2
                            )
                            update_sent = time.perf_counter()
                    elif message.get("type") == "error":
                        print("error:", message)
        if not chunks:
            raise SystemExit("no chunk arrived")
        first = chunks[0][0] - t0
        frames = sum(m["num_frames"] for _, m in chunks)
        span = chunks[-1][0] - chunks[0][0]
        later = sum(m["num_frames"] for _, m in chunks[1:])
        print(f"time to first chunk: {first:.2f} s ({chunks[0][1]['num_frames']} frames)")
        if span > 0:
            print(
                f"generated after the first chunk: {later / span:.1f} fps ({later} frames in {span:.2f} s; "
                f"real time = {HELIOS['fps']} fps)"
            )
        print(f"whole session: {frames} frames in {chunks[-1][0] - t0:.2f} s")
        for _, m in chunks:
            if m["started_event_ids"] or m["active_event_ids"]:
                print(
                    f"  chunk {m['generation_chunk_index']}: started {m['started_event_ids']} "
                    f"active {m['active_event_ids']} completed {m['completed_event_ids']} "
                    f"progress {m['transition_progress']}"
                )


if __name__ == "__main__":
    main()
