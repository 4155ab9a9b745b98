"""Backend settings: the `parameters` of `config.pbtxt`, validated once at model load."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Mapping

from rtvideo.core.session_config import ModelCapabilities

GENERATORS = ("builtin",)


@dataclass(frozen=True)
class BackendSettings:
    """Every knob of the model, with the defaults documented in the README."""

    generator: str = "builtin"
    width: int = 256
    height: int = 256
    fps: int = 16
    frames_per_chunk: int = 9
    default_transition_chunks: int = 3
    #: chunks generation may run ahead of real-time playback; None = unpaced (benchmarks, offline)
    pacing_lead_chunks: float | None = 1.0
    max_sessions: int = 8
    max_session_seconds: float = 3600.0
    stall_timeout_seconds: float = 60.0
    device: str = "auto"
    torch_threads: int = 1

    @classmethod
    def from_parameters(cls, params: Mapping[str, str]) -> "BackendSettings":
        """Parse string parameters; unknown names and bad values fail the model load loudly."""
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(params) - set(known))
        if unknown:
            raise ValueError(f"unknown model parameter(s): {', '.join(unknown)}")
        values: dict[str, object] = {}
        for name, raw in params.items():
            text = raw.strip()
            try:
                if name in ("generator", "device"):
                    values[name] = text
                elif name == "pacing_lead_chunks":
                    values[name] = None if text.lower() in ("off", "none", "unpaced") else float(text)
                elif name in ("max_session_seconds", "stall_timeout_seconds"):
                    values[name] = float(text)
                else:
                    values[name] = int(text)
            except ValueError:
                raise ValueError(f"model parameter {name}={raw!r} is not a valid value") from None
        settings = cls(**values)  # type: ignore[arg-type]
        settings.check()
        return settings

    def check(self) -> None:
        if self.generator not in GENERATORS:
            raise ValueError(f"generator {self.generator!r} is not available; choose one of {GENERATORS}")
        positive = ("width", "height", "fps", "frames_per_chunk", "max_sessions", "torch_threads")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"model parameter {name} must be positive")
        if self.width % 2 or self.height % 2:
            raise ValueError("width and height must be even (H.264 4:2:0)")
        if self.default_transition_chunks < 0:
            raise ValueError("default_transition_chunks must be >= 0")
        if self.pacing_lead_chunks is not None and self.pacing_lead_chunks < 0:
            raise ValueError("pacing_lead_chunks must be >= 0 (or 'off')")
        if self.max_session_seconds <= 0 or self.stall_timeout_seconds <= 0:
            raise ValueError("max_session_seconds and stall_timeout_seconds must be positive")
        if self.device not in ("auto", "cpu") and not self.device.startswith("cuda"):
            raise ValueError(f"device {self.device!r}: use auto, cpu or cuda[:N]")

    def capabilities(self, model_name: str) -> ModelCapabilities:
        return ModelCapabilities(
            model_names=(model_name, f"rtvideo-{self.generator}"),
            width=self.width,
            height=self.height,
            fps=self.fps,
            frames_per_chunk=self.frames_per_chunk,
            default_transition_chunks=self.default_transition_chunks,
        )
