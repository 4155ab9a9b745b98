"""CPU thread pools and the device of a process that renders (the model's, or a render worker's)."""

from __future__ import annotations


def limit_cpu_threads(threads: int, *, blas: bool = True) -> None:
    """Cap torch's and (with `blas`) the BLAS libraries' CPU thread pools (OpenBLAS, OpenMP, MKL).

    Many sessions share the cores and each renders on one thread, while an uncapped BLAS
    pool keeps one spinning thread per core between calls, taking CPU from the request path.
    Only a process that renders resizes the BLAS pool (`blas`): the model's process does no
    BLAS work when render workers render, and resizing it there is not safe at its exit."""
    import torch

    torch.set_num_threads(threads)
    if blas:
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=threads)  # applies now and stays (no `with`)


def resolve_device(device: str) -> str:
    """'auto' means CUDA when this process can see a GPU, else the CPU."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
