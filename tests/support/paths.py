"""Where the tests find the repository's files."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
SUPPORT = Path(__file__).resolve().parent
