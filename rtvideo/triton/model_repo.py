"""Derive Triton model directories from the shipped one, with `parameters` overrides.

Used by the tests, the benchmarks, `rtvideo serve --width …` and the image's build
(`python -m rtvideo.backend.loading.derive`): the shipped `config.pbtxt` stays the single
source, a derived copy only changes values.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Mapping
from functools import partial
from pathlib import Path

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


#: a protobuf text-format string body: anything but quotes and backslashes, or an escape
_STRING = r'"((?:[^"\\]|\\.)*)"'
_PARAMETER = re.compile(r'^parameters: \{ key: "([^"]+)" value: \{ string_value: ' + _STRING + r" \} \}", re.M)


def pbtxt_escape(value: str) -> str:
    """`value` as the body of a pbtxt string (JSON values carry quotes)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def pbtxt_unescape(body: str) -> str:
    """The text a pbtxt string body stands for (the simple escapes `pbtxt_escape` writes)."""
    return re.sub(r"\\(.)", lambda m: {"n": "\n"}.get(m.group(1), m.group(1)), body)


def _with_body(body: str, match: re.Match[str]) -> str:
    """A `re.sub` replacement: the match's group 1 (the text before the string), then `body` quoted."""
    return f'{match.group(1)}"{body}"'


def read_parameters(source: Path = MODEL_DIR) -> dict[str, str]:
    """The `parameters` of a model directory's `config.pbtxt`, as text."""
    found = _PARAMETER.findall((Path(source) / "config.pbtxt").read_text())
    return {key: pbtxt_unescape(body) for key, body in found}


def read_candidate_sequences(source: Path = MODEL_DIR) -> int | None:
    """The sequence batcher's `max_candidate_sequences` in a model directory's `config.pbtxt`."""
    found = re.search(r"^\s*max_candidate_sequences:\s*(\d+)", (Path(source) / "config.pbtxt").read_text(), re.M)
    return int(found.group(1)) if found else None


#: the sequence batcher's numeric fields `derive_model` may change
SEQUENCE_BATCHING_FIELDS = ("max_candidate_sequences", "max_sequence_idle_microseconds")


def derive_model(
    target: Path,
    name: str,
    params: Mapping[str, str],
    source: Path = MODEL_DIR,
    *,
    sequence_batching: Mapping[str, int] | None = None,
) -> Path:
    """Copy the model directory `source` into `target/name` as model `name`, replacing the
    given `parameters` values and `sequence_batching` fields (`SEQUENCE_BATCHING_FIELDS`, e.g. a
    short `max_sequence_idle_microseconds` for a test); an unknown parameter or field raises
    KeyError (a typo never passes)."""
    dst = Path(target) / name
    shutil.copytree(Path(source) / "1", dst / "1", ignore=shutil.ignore_patterns("__pycache__"))
    config = (Path(source) / "config.pbtxt").read_text()
    config, count = re.subn(r'^name:\s*"[^"]*"', f'name: "{name}"', config, count=1, flags=re.M)
    if count != 1:
        raise KeyError(f"{source}/config.pbtxt has no top-level name")
    for key, value in params.items():
        pattern = rf'(parameters: \{{ key: "{re.escape(key)}" value: \{{ string_value: )' + _STRING
        config, count = re.subn(pattern, partial(_with_body, pbtxt_escape(str(value))), config)
        if count != 1:
            raise KeyError(f"parameter {key} not found in {source}/config.pbtxt")
    for key, number in (sequence_batching or {}).items():
        if key not in SEQUENCE_BATCHING_FIELDS:
            raise KeyError(f"sequence_batching field {key}: derive_model changes only {SEQUENCE_BATCHING_FIELDS}")
        config, count = re.subn(rf"^(\s*{key}:\s*)\d+", rf"\g<1>{int(number)}", config, count=1, flags=re.M)
        if count != 1:
            raise KeyError(f"sequence_batching field {key} not found in {source}/config.pbtxt")
    (dst / "config.pbtxt").write_text(config)
    return dst
