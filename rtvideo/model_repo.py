"""Derive Triton model directories from the shipped one, with `parameters` overrides.

Used by the tests, the benchmarks and `rtvideo serve --width …`: the shipped
`config.pbtxt` stays the single source, a derived copy only changes values.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Mapping

import rtvideo



def _shipped_repository() -> Path:
    """The model repository: inside the installed package (`rtvideo/model_repository`, package
    data of a wheel), or `model_repository/` beside the package in a checkout."""
    package = Path(rtvideo.__file__).resolve().parent
    for candidate in (package / "model_repository", package.parent / "model_repository"):
        if (candidate / "realtime_video" / "config.pbtxt").is_file():
            return candidate
    raise FileNotFoundError(f"no model repository in {package} or beside it: a broken install")


#: the repository `rtvideo serve` serves by default
MODEL_REPOSITORY = _shipped_repository()
#: the shipped model directory (`config.pbtxt` + `1/model.py`)
MODEL_DIR = MODEL_REPOSITORY / "realtime_video"


_PARAMETER = re.compile(r'^parameters: \{ key: "([^"]+)" value: \{ string_value: "([^"]*)" \} \}', re.M)


def read_parameters(source: Path = MODEL_DIR) -> dict[str, str]:
    """The `parameters` of a model directory's `config.pbtxt`, as text."""
    return dict(_PARAMETER.findall((Path(source) / "config.pbtxt").read_text()))


def read_candidate_sequences(source: Path = MODEL_DIR) -> int | None:
    """The sequence batcher's `max_candidate_sequences` in a model directory's `config.pbtxt`."""
    found = re.search(r"^\s*max_candidate_sequences:\s*(\d+)", (Path(source) / "config.pbtxt").read_text(), re.M)
    return int(found.group(1)) if found else None


def derive_model(target: Path, name: str, params: Mapping[str, str], source: Path = MODEL_DIR) -> Path:
    """Copy the model directory `source` into `target/name` as model `name`, replacing the
    given `parameters` values; an unknown parameter raises KeyError (a typo never passes)."""
    dst = Path(target) / name
    shutil.copytree(Path(source) / "1", dst / "1", ignore=shutil.ignore_patterns("__pycache__"))
    config = (Path(source) / "config.pbtxt").read_text()
    config, count = re.subn(r'^name:\s*"[^"]*"', f'name: "{name}"', config, count=1, flags=re.M)
    if count != 1:
        raise KeyError(f"{source}/config.pbtxt has no top-level name")
    for key, value in params.items():
        pattern = rf'(parameters: \{{ key: "{re.escape(key)}" value: \{{ string_value: )"[^"]*"'
        config, count = re.subn(pattern, lambda m: f'{m.group(1)}"{value}"', config)
        if count != 1:
            raise KeyError(f"parameter {key} not found in {source}/config.pbtxt")
    (dst / "config.pbtxt").write_text(config)
    return dst
