#!/usr/bin/env bash
# The test command of the README: set-up (idempotent) then the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q "$@"
