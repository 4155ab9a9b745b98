"""Frames per second of the built-in generator, the fMP4 encoder, and both, against real time.

Run: .venv/bin/python benchmarks/bench_generator.py [--width 256 --height 256 --seconds 3]
Each figure is measured with torch on one thread (one core) and with torch's default
thread count. Prompts are embedded before timing (the text encoder caches them); the
cost of a new prompt is printed separately.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterator

import numpy as np
import torch

from rtvideo.backend.encoder import FragmentedMp4Encoder
from rtvideo.backend.generator import BuiltinGenerator

CHUNK_FRAMES = 9
FPS = 16
PROMPTS = ("ocean waves at sunset", "a forest of pine trees in fog")
#: prompts that switch on the costliest elements of the built-in scene (particles, flames, glints)
BUSY = ("a burning lighthouse by the sea in a blizzard at night", "rain on a neon city street with a red car and a bonfire")


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


def measure(generator: BuiltinGenerator, width: int, height: int, seconds: float) -> dict[str, float]:
    mixes = transition_mixes()
    session = generator.open_session(width=width, height=height, seed=1)
    frames = session.generate(next(mixes), CHUNK_FRAMES)
    encoder = FragmentedMp4Encoder(width, height, FPS)

    def generate_only() -> None:
        session.generate(next(mixes), CHUNK_FRAMES)

    busy_mixes, busy_session = transition_mixes(BUSY), generator.open_session(width=width, height=height, seed=1)

    def generate_busy() -> None:
        busy_session.generate(next(busy_mixes), CHUNK_FRAMES)

    def encode_only() -> None:
        encoder.encode_chunk(frames)

    def both() -> None:
        encoder.encode_chunk(session.generate(next(mixes), CHUNK_FRAMES))

    return {
        "generator": frames_per_second(generate_only, seconds),
        "generator, busy": frames_per_second(generate_busy, seconds),
        "encoder": frames_per_second(encode_only, seconds),
        "generator+encoder": frames_per_second(both, seconds),
    }


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
    args = parser.parse_args()

    default_threads = torch.get_num_threads()
    generator = BuiltinGenerator(device="cpu", fps=FPS)
    for prompt in PROMPTS + BUSY:
        generator.embed(prompt)

    print(f"{args.width}x{args.height}, {CHUNK_FRAMES} frames per chunk, real time = {FPS} fps")
    print(f"{'torch threads':>13} | {'stage':<18} | {'frames/s':>9} | {'x real time':>11} | {'ms/chunk':>8}")
    for threads in sorted({1, default_threads}):
        torch.set_num_threads(threads)
        for stage, fps in measure(generator, args.width, args.height, args.seconds).items():
            print(f"{threads:>13} | {stage:<18} | {fps:9.0f} | {fps / FPS:11.1f} | {CHUNK_FRAMES / fps * 1000:8.2f}")
        embed_ms = new_prompt_ms(generator, tag=f"threads={threads}")
        print(f"{threads:>13} | {'new prompt embed':<18} | {'':>9} | {'':>11} | {embed_ms:8.2f}")
    print(f"(x264 runs single-threaded in every row; numpy {np.__version__}, torch {torch.__version__})")


if __name__ == "__main__":
    main()
