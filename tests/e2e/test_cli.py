"""`rtvideo serve` as a real subprocess: ready line, one session through it, SIGTERM, nothing left."""

from __future__ import annotations

from pathlib import Path

from tests.support.processes import RTVIDEO
from tests.support.serve_session import serve_one_session


def test_serve_session_and_clean_sigterm(tmp_path: Path) -> None:
    serve_one_session(RTVIDEO, tmp_path)
