#!/usr/bin/env bash
# mypy over the checkout with every module under its installed name: `proxy/` as `rtvideo.proxy`,
# `client/` as `rtvideo.client` (pyproject.toml's package-dir), no tree of links
# (scripts/typecheck.py; docs/decisions.md, "Type checking the installed layout").
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python scripts/typecheck.py "$@"
