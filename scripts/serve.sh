#!/usr/bin/env bash
# The serve command of the README: set-up (idempotent), then Triton + the WebSocket proxy.
# Flags go to `rtvideo serve` (see `.venv/bin/rtvideo serve --help`). Recordings are on, in
# ./recordings (docs/recordings.md), unless the flags or RTVIDEO_RECORDINGS name another place.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec env RTVIDEO_RECORDINGS="${RTVIDEO_RECORDINGS:-recordings}" .venv/bin/rtvideo serve "$@"
