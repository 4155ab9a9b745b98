#!/usr/bin/env bash
# Creates .venv with everything the service and the tests need, from the package registries.
# Idempotent: a second run only checks what is there.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
VPY=.venv/bin/python
"$VPY" -m pip install -q --upgrade pip >/dev/null
# CPU machines: take the CPU build of torch first (a plain "torch" would pull a multi-GB CUDA build).
if ! "$VPY" -c "import torch" 2>/dev/null; then
  if [ "$(uname -m)" = "x86_64" ] && ! command -v nvidia-smi >/dev/null 2>&1; then
    "$VPY" -m pip install -q "torch==2.13.0" || "$VPY" -m pip install -q "torch>=2.4,<2.15"
  else
    "$VPY" -m pip install -q "torch>=2.4,<2.15"
  fi
fi
"$VPY" -m pip install -q -e ".[server,test]"
