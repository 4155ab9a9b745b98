"""Wires settings into a ready `SessionManager`; shared by the Triton model and the benchmarks."""

from __future__ import annotations

import functools
import logging

from rtvideo.backend.manager import SessionManager
from rtvideo.backend.ports import Metrics
from rtvideo.backend.session import Limits
from rtvideo.backend.settings import BackendSettings

log = logging.getLogger(__name__)


def resolve_device(device: str) -> str:
    """'auto' means CUDA when this process can see a GPU, else the CPU."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def build_manager(settings: BackendSettings, model_name: str, metrics: Metrics | None = None) -> SessionManager:
    """Load the generator (the slow part of model load) and return the session manager."""
    import torch

    from rtvideo.backend.encoder import FragmentedMp4Encoder
    from rtvideo.backend.generator import BuiltinGenerator

    torch.set_num_threads(settings.torch_threads)
    device = resolve_device(settings.device)
    generator = BuiltinGenerator(device=device, fps=settings.fps)
    log.info("generator=%s device=%s settings=%s", settings.generator, device, settings)
    return SessionManager(
        generator=generator,
        encoder_factory=functools.partial(FragmentedMp4Encoder, limits=generator.limits),
        capabilities=settings.capabilities(model_name),
        limits=Limits(
            pacing_lead_chunks=settings.pacing_lead_chunks,
            max_session_seconds=settings.max_session_seconds,
            stall_timeout_seconds=settings.stall_timeout_seconds,
        ),
        max_sessions=settings.max_sessions,
        metrics=metrics,
    )
