"""Build a model repository for tests from the real one, with parameter overrides."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Mapping

REPO = Path(__file__).resolve().parents[1] / "model_repository"


def derive_model(target: Path, name: str, params: Mapping[str, str]) -> Path:
    """Copy `realtime_video` as model `name`, replacing the given `parameters` values."""
    src = REPO / "realtime_video"
    dst = target / name
    shutil.copytree(src / "1", dst / "1", ignore=shutil.ignore_patterns("__pycache__"))
    config = (src / "config.pbtxt").read_text()
    config = re.sub(r'^name: "realtime_video"', f'name: "{name}"', config, count=1, flags=re.M)
    for key, value in params.items():
        pattern = rf'(parameters: \{{ key: "{key}" value: \{{ string_value: )"[^"]*"'
        config, count = re.subn(pattern, rf'\1"{value}"', config)
        if count != 1:
            raise KeyError(f"parameter {key} not found in config.pbtxt")
    (dst / "config.pbtxt").write_text(config)
    return dst
