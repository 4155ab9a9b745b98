#!/usr/bin/env bash
# The serve command of the README: set-up (idempotent), then Triton + the WebSocket proxy.
# Flags go to `rtvideo serve` (see `.venv/bin/rtvideo serve --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/rtvideo serve "$@"
