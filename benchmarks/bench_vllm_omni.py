"""Sessions of generator=vllm_omni through Triton, on a GPU: time to first chunk, generated fps
against a baseline measured in the same session, and (with --assert, as scripts/gpu_check.sh runs
it) the engine path proved or failed.

Every model-specific figure comes from the one rules table, `rtvideo/backend/vllm_omni/model_rules.py`,
for the model as deployed (its pipeline class from `model_class_name`, the deploy config or the
model's `model_index.json`; LingBot-World's size from the deploy config): the session size
(`default_size`), the frames of a request of `--chunks` chunks (its frame rule: Helios 33 a chunk,
LingBot-World 9 then 12, n % 12 == 9), whether a first frame is sent (LingBot-World: required on
every request; a generated PNG), which update a session sends (a prompt for Helios, a camera
target for LingBot-World: `interactions`), the session's fps (`default_fps`: what the docs promise
for the model), and the real-time budget. `--show-rules` prints them and exits (no GPU needed).

Needs `tritonserver`, vLLM + vllm-omni, and the model's weights already on disk (nothing is
downloaded: HF_HUB_OFFLINE=1). Starts its own Triton with the model derived for vllm_omni and
runs direct-gRPC sessions. With --assert it exits 1, listing each failure, unless:

1. vLLM and vllm-omni agree on major.minor and importing vllm_omni warns of no mismatch;
2. a bounded session (`--chunks` whole chunks at the model's size) gives exactly that many frames,
   each payload at the asked size, and the concatenated payloads decode to that many frames;
3. an update sent after the first chunk is started at a later boundary and completed within its
   `transition_chunks`, with no error;
4. an update sent at once after `video.start` (before the first chunk) is held without error
   and started later;
5. GPU memory (nvidia-smi, the device's used memory) after a second such session is no more
   than `--memory-tolerance-mib` above the first's;
6. `session.stop`, and a disconnect (the stream cancelled), of an open-ended session end the
   engine request: the GPU goes idle within `--idle-timeout` s (an engine still generating the
   request keeps it busy);
7. real time (`--realtime`, on by default with `--assert` against the real engine): the first
   chunk within the model's budget and the fps delivered after it at least the session's and
   at least the fps the docs promise for the model (`ModelRules.realtime_problems`).

The first session after load is not held to the first-chunk budget: the engine warms up at load
on its own small request (vLLM-Omni's `diffusion_engine.py` `_dummy_run`: 512x512, 2 steps, no
extra_args, so Helios runs stage 1 only; LingBot-World skips it, `dummy_run_num_frames = 0`), not
the sessions' size and pyramid, so the first real session pays for compiling and allocating at
640x384 with the 3-stage pyramid. `--warmup-chunks` (1 by default; 0: none) runs
one such session of the real size first and reports it apart ("first session after load"); the
budget is asserted on the sessions after it.

Printed per model at the end (`summary:` lines, which scripts/gpu_check.sh repeats in its result):
the first chunk (warm, and of the first session after load), the sustained fps after the first
chunk, and the GPU memory peak, each against the rules table: the engine's own peak
(vLLM-Omni's per-output `peak_memory_mb`: its worker's torch max_memory_reserved for the
request, at least max_memory_allocated; the model logs it when a request ends and this reads it
from Triton's log) and the device's (nvidia-smi's memory.used, sampled every 0.5 s), against
`ModelRules.reserved_bytes` (weights plus one session at its peak, before activations).

The baseline: each session asks for in-band timing (`metrics: true`), so every chunk says how long
the model waited for the engine's output (`timing.generate_seconds`); the engine's own rate from
those times, in the same session, is printed beside the rate this client received, so the figure
says what our path (encoding, Triton, gRPC) costs, not only what the GPU did.

    python3 benchmarks/bench_vllm_omni.py [--model BestWishYsh/Helios-Distilled --chunks 5 --assert]
    python3 benchmarks/bench_vllm_omni.py --model DIR --engine-args '{"deploy_config": "deploy/gpu/lingbot_world_stepwise.yaml"}'

On a CPU it runs against the stand-in engine (`--engine tests.support.omni_standin:StandInAsyncOmni`,
a fake `nvidia-smi` on PATH; tests/deploy/test_bench_vllm_omni.py), for either model's rules
(`--engine-args '{"model_class_name": "LingBotWorldCausalDMDPipeline"}'`: the stand-in then
refuses, as LingBot's pipeline does, a request at another size, without a first frame or with
another frame count): the engine path then proves nothing about vLLM-Omni (1 is not checked; no
figure is a GPU figure), only that the assertions hold for an engine that behaves as the runner
does. The stand-in is paced at the model's published rate (`reference_fps` in the table, unless
`--engine-args` sets `chunk_seconds`): at its default pace (a chunk every 0.05 s) it ends a
5-chunk request before the session has even encoded chunk 0 at 640x384 on a CPU, so an update
could only reach the engine after the request's last chunk boundary.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import re
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rtvideo.backend.vllm_omni import device_memory, interaction_rules, model_rules
from rtvideo.backend.vllm_omni.model_rules import FirstFrame, ModelRules
from rtvideo.backend.vllm_omni.presets import vllm_omni_preset
from rtvideo.client.triton_stream import TritonStreamSession
from rtvideo.triton.access import generate_key
from rtvideo.triton.command import TritonConfig
from rtvideo.triton.model_repo import derive_model
from rtvideo.triton.server import TritonServer, free_port

PROMPT = "A quiet harbour at dawn, boats rocking gently"
UPDATE = "A snowy street illuminated by warm lanterns"
#: this checkout, where a stand-in engine's module is imported from (`--engine tests.support...`)
CHECKOUT = Path(__file__).resolve().parents[1]


def checkout_importable() -> dict[str, str]:
    """The Triton's `PYTHONPATH` when the engine is a stand-in: this checkout first, so that its
    stub imports the stand-in's module; vLLM-Omni's own engine comes from the installed packages."""
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(CHECKOUT), os.environ.get("PYTHONPATH", "")) if p)}


def camera_target(translation: list[float]) -> dict[str, Any]:
    """A camera event (LingBot-World's only interaction): a target pose, Unity axes."""
    pose = {"translation": translation, "rotation": [0.0, 0.0, 0.0, 1.0]}
    return {"multi_modal_data": {"camera": {"mode": "target", "data": pose}}}


@dataclass(frozen=True)
class Plan:
    """What the sessions ask for, all of it from the model's rules as deployed."""

    rules: ModelRules
    width: int
    height: int
    fps: int
    num_frames: int
    first_frame: bool

    def update(self, text: str, translation: list[float]) -> dict[str, Any]:
        """The update this model takes: a prompt where it has a prompt handler, else a camera target."""
        if "prompt" in self.rules.interactions:
            return {"prompt": text}
        return camera_target(translation)

    def describe(self) -> str:
        first = self.rules.first_frame is FirstFrame.REQUIRED
        return (
            f"rules: {self.rules.name} {self.width}x{self.height} at {self.fps} fps "
            f"(documented {self.rules.default_fps}; reference {self.rules.reference_fps} fps: "
            f"{self.rules.fps_source or 'none published'}), {self.num_frames} frames "
            f"(chunks {self.rules.chunk_frames(self.num_frames)}; rule {self.rules.frames_rule()}), "
            f"first frame {'required' if first else 'optional'} ({'sent' if self.first_frame else 'not sent'}), "
            f"updates {sorted(self.rules.interactions)}, first-chunk budget {self.rules.first_chunk_budget_seconds:g} s"
        )


def deployed_rules(model: str, engine_args: dict[str, Any], extra: dict[str, Any] | None) -> ModelRules:
    """The table's rules for `model` as this deployment runs it (as `BackendSettings.model_rules`
    finds them: pipeline class, deploy config's size, the extra params' pyramid)."""
    pipeline = interaction_rules.pipeline_class(model, engine_args)
    rules = model_rules.find(model, pipeline)
    if rules is None:
        raise SystemExit(
            f"bench_vllm_omni: no rules for model {model!r} (pipeline {pipeline!r}) in model_rules.py: "
            "set model_class_name or deploy_config in --engine-args"
        )
    rules = rules.for_model_config(interaction_rules.deploy_model_config(engine_args.get("deploy_config")))
    if extra is None:
        extra = vllm_omni_preset(model, rules)["extra_params"]
    return rules.for_deployment(extra)


def make_plan(rules: ModelRules, chunks: int, size: str | None, fps: int | None) -> Plan:
    width, height = rules.default_size
    if size is not None:
        w, _, h = size.partition("x")
        if not (w.isdigit() and h.isdigit()):
            raise SystemExit(f"--size {size!r}: use WxH, e.g. {width}x{height}")
        width, height = int(w), int(h)
    problem = rules.size_problem(width, height)
    if problem is not None:
        raise SystemExit(f"bench_vllm_omni: {problem}")
    return Plan(
        rules,
        width,
        height,
        fps or rules.default_fps,
        rules.request_length(chunks),
        rules.first_frame is FirstFrame.REQUIRED,
    )


def png_data_url(width: int, height: int) -> str:
    """A plain first frame (a vertical gradient) as a PNG data URL, made with zlib alone."""
    row = bytes([0]) + bytes(v for x in range(width) for v in (40, (x * 200) // max(1, width - 1), 160))
    raw = row * height

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
    return "data:image/png;base64," + base64.b64encode(png).decode()


@dataclass
class Session:
    """What one session's stream carried."""

    t0: float
    chunks: list[tuple[float, dict[str, Any], bytes]] = field(default_factory=list)  # media and trailer
    errors: list[dict[str, Any]] = field(default_factory=list)
    done: dict[str, Any] | None = None

    @property
    def media(self) -> list[tuple[float, dict[str, Any], bytes]]:
        return [c for c in self.chunks if c[1]["kind"] == "media"]

    def frames(self) -> int:
        return sum(m["num_frames"] for _, m, _ in self.media)

    def chunk_of(self, field_name: str, event_id: str) -> int | None:
        """The generation chunk whose metadata first lists `event_id` under `field_name`."""
        for _, m, _ in self.media:
            if event_id in m.get(field_name, []):
                return int(m["generation_chunk_index"])
        return None


def run_session(
    s: TritonStreamSession,
    plan: Plan,
    *,
    num_frames: int | None,
    update_after_first: bool = False,
    update_at_once: bool = False,
    end_after_first: str | None = None,  # "stop" or "disconnect"
    timeout: float = 900,
) -> Session:
    fields: dict[str, Any] = {"seed": 7, "width": plan.width, "height": plan.height, "metrics": True}
    if plan.first_frame:
        fields["image_reference"] = {"image_url": png_data_url(plan.width, plan.height)}
    if num_frames is not None:
        fields["num_frames"] = num_frames
    out = Session(time.perf_counter())
    s.start(PROMPT, **fields)
    if update_at_once:
        s.interact(event=plan.update(UPDATE, [0.0, 0.0, 1.0]), event_id="early", transition_chunks=1)
    for reply in s.until("session.done", timeout=timeout):
        message = reply.message or {}
        kind = message.get("type")
        if kind == "video.chunk_metadata":
            out.chunks.append((reply.received, message, reply.data))
            if message["kind"] == "media" and len(out.media) == 1:
                if update_after_first:
                    s.interact(event=plan.update(UPDATE, [0.5, 0.0, 0.0]), event_id="update", transition_chunks=2)
                if end_after_first == "stop":
                    s.stop()
                elif end_after_first == "disconnect":
                    s.cancel()
                    return out
        elif kind == "error":
            out.errors.append(message)
            print("error:", message)
        elif kind == "session.done":
            out.done = message
    return out


def decode_frames(payloads: list[bytes]) -> list[tuple[int, int]]:
    """(height, width) of each frame the concatenated payloads decode to (PyAV)."""
    import av

    with av.open(io.BytesIO(b"".join(payloads)), mode="r", format="mp4") as container:
        return [(f.height, f.width) for f in container.decode(video=0)]


def nvidia_smi(query: str) -> int:
    """One figure of the first visible GPU (memory.used in MiB, utilization.gpu in %)."""
    index = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0]
    out = subprocess.run(
        ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits", f"--id={index}"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    return int(float(out.stdout.strip().splitlines()[0]))


def gpu_goes_idle(timeout: float) -> float | None:
    """Seconds until the GPU's utilization stays under 10 % for three samples; None if it does not."""
    t0 = time.perf_counter()
    quiet = 0
    while time.perf_counter() - t0 < timeout:
        quiet = quiet + 1 if nvidia_smi("utilization.gpu") < 10 else 0
        if quiet >= 3:
            return time.perf_counter() - t0
        time.sleep(0.5)
    return None


class DeviceMemoryPeak:
    """The device's used memory (nvidia-smi) sampled every `interval` s on a thread; `peak_mib`
    is the largest reading (None: no reading succeeded)."""

    def __init__(self, interval: float = 0.5) -> None:
        self.peak_mib: int | None = None
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nvidia-smi-sampler", daemon=True)

    def __enter__(self) -> DeviceMemoryPeak:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=35)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                used = nvidia_smi("memory.used")
            except (OSError, subprocess.SubprocessError, ValueError, IndexError):
                used = None
            if used is not None:
                self.peak_mib = used if self.peak_mib is None else max(self.peak_mib, used)
            self._stop.wait(self._interval)


#: the model's line when an engine request ends (`EngineChunkSource.close`)
ENGINE_PEAK_LINE = re.compile(r"engine request (\S+): GPU memory peak (\d+) MiB")


#: vLLM-Omni's own line (`diffusion_model_runner.py` `_sample_peak_memory_mb`, at DEBUG): the
#: worker's torch max_memory_reserved and max_memory_allocated for the request, in GiB
ALLOCATED_PEAK_LINE = re.compile(r"Peak GPU memory \(this request\): ([\d.]+) GB reserved, ([\d.]+) GB allocated")


def allocated_peak_mib(log_text: str) -> int | None:
    """The largest `torch.cuda.max_memory_allocated` the engine's worker logged (None: not logged;
    it logs at DEBUG, which `--allocated-peak` turns on)."""
    peaks = [float(m.group(2)) for m in ALLOCATED_PEAK_LINE.finditer(log_text)]
    return round(max(peaks) * 1024) if peaks else None


def engine_peak_mib(log_text: str) -> int | None:
    """The largest per-request GPU memory peak the model logged (None: the engine reported none)."""
    peaks = [int(m.group(2)) for m in ENGINE_PEAK_LINE.finditer(log_text)]
    return max(peaks) if peaks else None


@dataclass
class Figures:
    """What the summary compares with the rules table, for one model."""

    first_session_first_chunk: float | None = None
    first_chunk: float | None = None
    sustained_fps: float | None = None
    engine_peak_mib: int | None = None
    allocated_peak_mib: int | None = None
    device_peak_mib: int | None = None


def summary(plan: Plan, figures: Figures, fp8: bool, real_engine: bool) -> list[str]:
    """The per-model `summary:` lines: each figure beside what the rules table states."""
    rules = plan.rules
    frames = plan.num_frames
    reserved = rules.reserved_bytes(plan.width, plan.height, frames, 1, fp8)
    weights = rules.reserved_bytes(plan.width, plan.height, frames, 0, fp8)

    def gb(mib: int | None) -> str:
        return "not measured" if mib is None else f"{mib * 2**20 / 1e9:.1f} GB"

    def ratio(mib: int | None) -> str:
        return "" if mib is None or not reserved else f" ({100 * mib * 2**20 / reserved:.0f} % of the table's)"

    where = "" if real_engine else " [stand-in engine on a CPU: not GPU figures]"
    name = rules.name
    return [
        f"summary: {name}{where}",
        f"summary: {name}: first chunk {figures.first_chunk} s after warm-up (budget "
        f"{rules.first_chunk_budget_seconds:g} s); first session after load: {figures.first_session_first_chunk} s "
        "(reported apart, not held to the budget)",
        f"summary: {name}: sustained {figures.sustained_fps} fps after the first chunk at {plan.width}x{plan.height} "
        f"(served at {rules.default_fps}; reference {rules.reference_fps}: {rules.fps_source or 'none published'})",
        f"summary: {name}: GPU memory peak: allocated {gb(figures.allocated_peak_mib)}"
        f"{ratio(figures.allocated_peak_mib)} (torch max_memory_allocated in the engine's worker, "
        f"its DEBUG line), engine {gb(figures.engine_peak_mib)}{ratio(figures.engine_peak_mib)} "
        f"(vLLM-Omni's peak_memory_mb: torch max_memory_reserved in its worker), device "
        f"{gb(figures.device_peak_mib)}{ratio(figures.device_peak_mib)} (nvidia-smi); rules table: "
        f"{reserved / 1e9:.1f} GB before activations ({weights / 1e9:.1f} GB weights{' in FP8' if fp8 else ''} + "
        f"one session of {frames} frames at its peak, {rules.memory.value})",
    ]


def version_failures() -> list[str]:
    from importlib.metadata import PackageNotFoundError, version

    try:
        vllm, omni = version("vllm"), version("vllm-omni")
    except PackageNotFoundError as e:
        return [f"{e.name} is not installed"]
    print(f"vLLM {vllm}, vllm-omni {omni}")
    failures = []
    if vllm.split(".")[:2] != omni.split(".")[:2]:
        failures.append(f"vLLM {vllm} and vllm-omni {omni} differ in major.minor")
    probe = subprocess.run(
        [sys.executable, "-W", "always", "-c", "import vllm_omni.version"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if probe.returncode != 0:
        failures.append(f"import vllm_omni failed: {probe.stderr.strip()[-500:]}")
    if "mismatched major/minor" in probe.stderr:
        failures.append("vllm-omni warns of a vLLM version mismatch at import")
    return failures


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model",
        default=os.environ.get("VLLM_OMNI_MODEL") or os.environ.get("HELIOS_MODEL", "BestWishYsh/Helios-Distilled"),
        help="a model id in the local cache or a directory; its rules come from model_rules.py",
    )
    parser.add_argument("--chunks", type=int, default=5, help="whole chunks in each bounded session")
    parser.add_argument("--engine-args", default="{}", help="AsyncOmni engine arguments, JSON")
    parser.add_argument(
        "--extra-params",
        default="auto",
        help="vllm_omni_extra_params: a JSON object, or auto (the model's real-time preset, vllm_omni/presets.py VLLM_OMNI_PRESETS)",
    )
    parser.add_argument("--size", default=None, help="WxH of the sessions (default: the model's, from its rules)")
    parser.add_argument("--fps", type=int, default=None, help="the sessions' fps (default: the model's documented one)")
    parser.add_argument("--show-rules", action="store_true", help="print the rules the sessions follow and exit")
    parser.add_argument("--log", type=Path, default=None, help="Triton's log (default: a temp file)")
    parser.add_argument("--assert", dest="check", action="store_true", help="assert the engine path (above)")
    parser.add_argument(
        "--realtime",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="fail unless the first chunk is within the model's budget and delivered fps >= the session's "
        "(default: on with --assert against the real engine; a stand-in on a CPU proves nothing about speed)",
    )
    parser.add_argument("--memory-tolerance-mib", type=int, default=512)
    parser.add_argument(
        "--allocated-peak",
        action="store_true",
        help="run the engine with VLLM_LOGGING_LEVEL=DEBUG so its worker logs torch.cuda.max_memory_allocated "
        "per request, and report it (more logging: gpu_check.sh turns it on)",
    )
    parser.add_argument(
        "--warmup-chunks",
        type=int,
        default=1,
        help="whole chunks of the session of the real size run first, reported apart and not held to "
        "the first-chunk budget (0: none, the first session after load is the measured one)",
    )
    parser.add_argument("--idle-timeout", type=float, default=30.0)
    parser.add_argument(
        "--engine",
        default="vllm_omni:AsyncOmni",
        help="engine factory, module:callable (a smoke test on CPU: tests.support.omni_standin:StandInAsyncOmni)",
    )
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    real_engine = args.engine.startswith("vllm_omni:")
    engine_args = json.loads(args.engine_args)
    extra = None if args.extra_params.strip() == "auto" else json.loads(args.extra_params)
    extra_params = "auto" if extra is None else json.dumps(extra)
    plan = make_plan(deployed_rules(args.model, engine_args, extra), args.chunks, args.size, args.fps)
    print(plan.describe())
    if args.show_rules:
        return
    rules = plan.rules
    if not real_engine:
        print(f"engine {args.engine}: a stand-in, not vLLM-Omni; versions not checked, no figure is a GPU figure")
        pace = rules.frames_per_chunk / (rules.reference_fps or rules.default_fps)
        first_pace = (rules.first_chunk_frames or rules.frames_per_chunk) / (rules.reference_fps or rules.default_fps)
        engine_args.setdefault("chunk_seconds", pace)
        engine_args.setdefault("first_chunk_seconds", first_pace)
        print(
            f"stand-in paced at {engine_args['chunk_seconds']:.2f} s per chunk "
            f"({rules.name} at its reference rate: {pace:.2f} s)"
        )
    failures: list[str] = version_failures() if args.check and real_engine else []

    def expect(ok: bool, what: str) -> None:
        print(("ok: " if ok else "ASSERTION FAILED: ") + what)
        if not ok:
            failures.append(what)

    n = plan.num_frames
    size = (plan.height, plan.width)
    with tempfile.TemporaryDirectory(prefix="rtvideo-omni-") as tmp:
        repo = Path(tmp)
        derive_model(
            repo,
            "realtime_video",
            {
                "width": str(plan.width),
                "height": str(plan.height),
                "fps": str(plan.fps),
                "frames_per_chunk": str(rules.frames_per_chunk),
                "generator": "vllm_omni",
                "max_sessions": "1",
                # measured and shown, never refusing: the check's own sessions must not be refused
                # by the running measurement (item 7 fails below the model's rate instead)
                "realtime_capacity_fps": "off",
                "vllm_omni_model": args.model,
                "vllm_omni_engine_args": json.dumps(engine_args),
                "vllm_omni_extra_params": extra_params,
                "vllm_omni_engine": args.engine,
            },
        )
        key = generate_key()  # keyed as `rtvideo serve` keys its own Triton
        # the worker's max_memory_allocated is logged by vLLM-Omni itself, at DEBUG only
        debug = {"VLLM_LOGGING_LEVEL": "DEBUG"} if args.allocated_peak else {}
        config = TritonConfig(
            repo,
            grpc_port=free_port(),
            http_port=free_port(),
            metrics_port=free_port(),
            key=key,
            environment={**({} if real_engine else checkout_importable()), **debug},
        )
        t_load = time.perf_counter()
        figures = Figures()
        log_path = args.log or repo / "triton.log"
        with TritonServer(config, stdout=log_path) as server, DeviceMemoryPeak() as device_peak:
            print(f"model loaded (engine start included) in {time.perf_counter() - t_load:.1f} s")
            if args.warmup_chunks > 0:
                # the engine's own warm-up is not this size nor this pyramid: one real session first
                with TritonStreamSession(server.grpc_url, key=key) as s:
                    warm = run_session(s, plan, num_frames=rules.request_length(args.warmup_chunks))
                figures.first_session_first_chunk = figures_of(warm)[0]
                print(
                    f"first session after load (warm-up at {plan.width}x{plan.height}, {warm.frames()} frames; "
                    f"not held to the budget): time to first chunk {figures.first_session_first_chunk} s"
                    + (f", errors {warm.errors}" if warm.errors else "")
                )
            with TritonStreamSession(server.grpc_url, key=key) as s:
                first = run_session(s, plan, num_frames=n, update_after_first=True)
            report(first, plan)
            figures.first_chunk, figures.sustained_fps = figures_of(first)
            if args.warmup_chunks <= 0:
                figures.first_session_first_chunk = figures.first_chunk
            if args.realtime or (args.check and real_engine and args.realtime is None):
                # 7. real time: the model's first-chunk budget, the session's fps and the documented one
                for problem in rules.realtime_problems(*figures_of(first), plan.fps):
                    print(f"REAL TIME FAILED: {problem}")
                    failures.append(problem)
            if not args.check:
                finish(figures, device_peak, Path(server.log.path or log_path), plan, engine_args, real_engine)
                if failures:
                    raise SystemExit(f"bench_vllm_omni: not real time: {'; '.join(failures)}")
                if not first.media:
                    raise SystemExit("no chunk arrived")
                return
            mem_first = nvidia_smi("memory.used")
            # 2. bounded: exactly N frames at the asked size, and they decode
            expect(not first.errors, f"no error in the bounded session ({first.errors})")
            expect(first.done is not None, "the bounded session ends with session.done")
            expect(first.frames() == n, f"the bounded session gives exactly {n} frames (got {first.frames()})")
            decoded = decode_frames([data for _, _, data in first.chunks])
            expect(len(decoded) == n, f"its payloads decode to {n} frames (got {len(decoded)})")
            expect(set(decoded) <= {size}, f"every decoded frame is {size[1]}x{size[0]} (got {sorted(set(decoded))})")
            # 3. an update after the first chunk: started later, completed within its transition
            expect(not (first.done or {}).get("unapplied_event_ids"), f"every update applied ({first.done})")
            started, completed = (
                first.chunk_of("started_event_ids", "update"),
                first.chunk_of("completed_event_ids", "update"),
            )
            expect(
                started is not None and started >= 1, f"the update is started at a boundary after chunk 0 ({started})"
            )
            expect(
                started is not None and completed is not None and completed <= started + 2,
                f"the update completes within its 2 transition chunks (started {started}, completed {completed})",
            )
            # 4. an early update is held without error and started later
            with TritonStreamSession(server.grpc_url, key=key) as s:
                early = run_session(s, plan, num_frames=n, update_at_once=True)
            expect(not early.errors, f"an update sent before the first chunk brings no error ({early.errors})")
            expect(
                early.chunk_of("started_event_ids", "early") is not None,
                f"the early update is started (session.done: {early.done})",
            )
            expect(early.frames() == n, f"the second bounded session gives exactly {n} frames too")
            # 5. GPU memory flat across the two sessions
            mem_second = nvidia_smi("memory.used")
            print(f"GPU memory used: {mem_first} MiB after session 1, {mem_second} MiB after session 2")
            expect(
                mem_second - mem_first <= args.memory_tolerance_mib,
                f"GPU memory does not grow across two sessions (+{mem_second - mem_first} MiB, "
                f"tolerance {args.memory_tolerance_mib} MiB)",
            )
            # 6. stop and disconnect end the engine request: the GPU goes idle
            for how in ("stop", "disconnect"):
                s = TritonStreamSession(server.grpc_url, key=key)
                try:
                    ended = run_session(s, plan, num_frames=None, end_after_first=how, timeout=300)
                finally:
                    s.close()
                expect(bool(ended.media), f"the open-ended session before the {how} streams")
                if how == "stop":
                    expect(ended.done is not None, "session.stop ends the session with session.done")
                idle = gpu_goes_idle(args.idle_timeout)
                expect(idle is not None, f"after the {how} the GPU goes idle within {args.idle_timeout} s ({idle})")
            finish(figures, device_peak, Path(server.log.path or log_path), plan, engine_args, real_engine)
    if failures:
        print(f"bench_vllm_omni: {len(failures)} assertion(s) failed:", file=sys.stderr)
        for f in failures:
            print(f"  - {f}", file=sys.stderr)
        raise SystemExit(1)
    if real_engine:
        print("bench_vllm_omni: every assertion passed")
    else:
        print(f"bench_vllm_omni: every assertion passed against the stand-in {args.engine} (not a GPU proof)")


def finish(
    figures: Figures,
    device_peak: DeviceMemoryPeak,
    log_path: Path,
    plan: Plan,
    engine_args: dict[str, Any],
    real_engine: bool,
) -> None:
    """Read the memory peaks and print the per-model summary."""
    figures.device_peak_mib = device_peak.peak_mib
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        text = ""
    figures.engine_peak_mib = engine_peak_mib(text)
    figures.allocated_peak_mib = allocated_peak_mib(text)
    for line in summary(plan, figures, device_memory.fp8_enabled(engine_args), real_engine):
        print(line)


def figures_of(session: Session) -> tuple[float | None, float | None]:
    """Time to the first chunk and the fps delivered after it (None: not measured)."""
    if not session.media:
        return None, None
    first = session.media[0][0] - session.t0
    later = sum(m["num_frames"] for _, m, _ in session.media[1:])
    span = session.media[-1][0] - session.media[0][0]
    return round(first, 2), round(later / span, 1) if span > 0 else None


def engine_fps(session: Session) -> float | None:
    """The baseline: the engine's own rate after the first chunk, from the model's in-band timing
    (the time each chunk's output took to come from the engine), measured in the same session."""
    later = session.media[1:]
    seconds = sum(float((m.get("timing") or {}).get("generate_seconds") or 0.0) for _, m, _ in later)
    frames = sum(m["num_frames"] for _, m, _ in later)
    return round(frames / seconds, 1) if later and seconds > 0 else None


def report(session: Session, plan: Plan) -> None:
    if not session.media:
        print("no media chunk arrived")
        return
    first = session.media[0][0] - session.t0
    later = sum(m["num_frames"] for _, m, _ in session.media[1:])
    span = session.media[-1][0] - session.media[0][0]
    print(f"time to first chunk: {first:.2f} s ({session.media[0][1]['num_frames']} frames)")
    if span > 0:
        delivered = later / span
        baseline = engine_fps(session)
        print(
            f"generated after the first chunk: {delivered:.1f} fps ({later} frames in {span:.2f} s; "
            f"real time = {plan.fps} fps, documented for {plan.rules.name}: {plan.rules.default_fps} fps)"
        )
        if baseline is not None:
            print(
                f"baseline, same session: the engine made {baseline:.1f} fps; this client got "
                f"{delivered:.1f} fps ({100 * delivered / baseline:.0f} % of the engine's)"
            )
    print(f"whole session: {session.frames()} frames in {session.media[-1][0] - session.t0:.2f} s")
    for _, m, _ in session.media:
        if m["started_event_ids"] or m["active_event_ids"]:
            print(
                f"  chunk {m['generation_chunk_index']}: started {m['started_event_ids']} "
                f"active {m['active_event_ids']} completed {m['completed_event_ids']} "
                f"progress {m['transition_progress']}"
            )


if __name__ == "__main__":
    main()
