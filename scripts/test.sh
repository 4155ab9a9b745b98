#!/usr/bin/env bash
# The test command of the README: set-up (idempotent) then the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The browser test plays the stream in a real headless Chromium (Debian package).
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "installing chromium for the browser test (apt-get)"
  $sudo apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium >/dev/null
fi
# The whole run (no arguments) first checks lint, format and types (config: pyproject.toml).
if [ "$#" -eq 0 ]; then
  echo "ruff check, ruff format --check, mypy (scripts/typecheck.sh)"
  .venv/bin/ruff check .
  .venv/bin/ruff format --check .
  bash scripts/typecheck.sh
fi
.venv/bin/python -m pytest -q "$@"
# The whole run then drives vLLM-Omni's real engine inside a real Triton (its own ~9 GB
# environment, built on the first run; docs/vllm-omni.md, "The real engine inside Triton").
if [ "$#" -eq 0 ]; then
  bash scripts/test_real_engine.sh --if-possible
fi
