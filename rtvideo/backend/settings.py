"""Backend settings: the `parameters` of `config.pbtxt`, each declared once, validated at model load.

`rtvideo serve` derives one flag per field (`--max-sessions`, ...) and passes the
values on as `parameters` of a derived model copy.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping

from rtvideo import settings_text
from rtvideo.backend import catalog
from rtvideo.core.session_config import ModelCapabilities
from rtvideo.settings_text import setting


@dataclass(frozen=True)
class BackendSettings:
    """Every knob of the model, with the defaults documented in the README."""

    generator: str = setting("builtin", "video generator: " + ", ".join(catalog.LIMITS))
    width: int = setting(256, "default frame width")
    height: int = setting(256, "default frame height")
    fps: int = setting(16, "default frames per second")
    frames_per_chunk: int = setting(9, "frames in each generation chunk")
    default_transition_chunks: int = setting(
        3, "transition length when an interaction gives none", flag="--transition-chunks")
    #: chunks generation may run ahead of real-time playback; None = unpaced (benchmarks, offline)
    pacing_lead_chunks: float | None = setting(
        1.0, "chunks generation may run ahead of playback ('off': unpaced)", flag="--pacing-lead")
    max_sessions: int = setting(8, "concurrent sessions in the model (server_busy beyond)")
    max_session_seconds: float = setting(3600.0, "longest session, in seconds")
    stall_timeout_seconds: float = setting(60.0, "end a session without generation progress for this long")
    device: str = setting("auto", "auto, cpu or cuda[:N]")
    torch_threads: int = setting(1, "torch intra-op threads of the model")

    @classmethod
    def from_parameters(cls, params: Mapping[str, str]) -> "BackendSettings":
        """Parse string parameters; unknown names and bad values fail the model load loudly."""
        settings = settings_text.from_text(cls, params, what="model parameter")
        settings.check()
        return settings

    def check(self) -> None:
        limits = catalog.LIMITS.get(self.generator)
        if limits is None:
            raise ValueError(f"generator {self.generator!r} is not available; choose one of {tuple(catalog.LIMITS)}")
        positive = ("width", "height", "fps", "frames_per_chunk", "max_sessions", "torch_threads")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"model parameter {name} must be positive")
        problem = limits.size_problem(self.width, self.height) or limits.fps_problem(self.fps)
        if problem:
            raise ValueError(f"model parameters width/height/fps: {problem}")
        if self.default_transition_chunks < 0:
            raise ValueError("default_transition_chunks must be >= 0")
        if self.pacing_lead_chunks is not None and self.pacing_lead_chunks < 0:
            raise ValueError("pacing_lead_chunks must be >= 0 (or 'off')")
        if self.max_session_seconds <= 0 or self.stall_timeout_seconds <= 0:
            raise ValueError("max_session_seconds and stall_timeout_seconds must be positive")
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", self.device):
            raise ValueError(f"device {self.device!r}: use auto, cpu or cuda[:N]")

    def check_sequence_slots(self, candidates: int | None) -> None:
        """`max_sessions` against the sequence batcher's `max_candidate_sequences`: with no slot to
        spare, a start beyond capacity waits silently in Triton's backlog instead of reaching the
        model (server_busy), and so does the proxy's health probe, which then fails: the backend
        is declared down and every session ends."""
        if candidates is not None and self.max_sessions >= candidates:
            raise ValueError(f"model parameter max_sessions={self.max_sessions} must be below the sequence "
                             f"batcher's max_candidate_sequences ({candidates}) in config.pbtxt")

    def capabilities(self, model_name: str) -> ModelCapabilities:
        return ModelCapabilities(
            model_names=(model_name, f"rtvideo-{self.generator}"),
            width=self.width,
            height=self.height,
            fps=self.fps,
            frames_per_chunk=self.frames_per_chunk,
            default_transition_chunks=self.default_transition_chunks,
            limits=catalog.LIMITS[self.generator],
        )
