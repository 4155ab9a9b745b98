"""Where the tests find the repository's files, and how a Triton's stub finds `tests`."""

import os
from collections.abc import Mapping
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
SUPPORT = Path(__file__).resolve().parent

#: the stand-in engine (omni_standin.py) as a model's `vllm_omni_engine` parameter names it
STANDIN_ENGINE = "tests.support.omni_standin:StandInAsyncOmni"


def tests_importable(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The environment a Triton needs when its models import from `tests` (the stand-in engine):
    `PYTHONPATH` with this checkout first, then `environ`'s own (`TritonConfig.environment`)."""
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), environ.get("PYTHONPATH", "")) if p)}
