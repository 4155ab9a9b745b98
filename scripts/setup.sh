#!/usr/bin/env bash
# Creates .venv with everything the service and the tests need, from the package registries.
# Once set up, a second run changes nothing and needs no network: it compares a stamp of the
# inputs (this script, pyproject.toml, the interpreter) and returns at once when they match.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
VPY=.venv/bin/python
STAMP=.venv/.rtvideo-setup
inputs=$(cat scripts/setup.sh pyproject.toml; "$VPY" -c 'import sys; print(sys.version)')
want=$(printf '%s' "$inputs" | sha256sum | cut -d' ' -f1)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  exit 0
fi
"$VPY" -m pip install -q --upgrade pip >/dev/null
# CPU machines: take the CPU build of torch first (a plain "torch" would pull a multi-GB CUDA
# build). The CPU build is what these machines' local wheel (2.13.0) is; elsewhere the package
# index decides which build a "torch" in the range is (see the README's platform notes).
if ! "$VPY" -c "import torch" 2>/dev/null; then
  if [ "$(uname -m)" = "x86_64" ] && ! command -v nvidia-smi >/dev/null 2>&1; then
    "$VPY" -m pip install -q "torch==2.13.0" || "$VPY" -m pip install -q "torch>=2.4,<2.15"
  else
    "$VPY" -m pip install -q "torch>=2.4,<2.15"
  fi
fi
"$VPY" -m pip install -q -e ".[test]"
# The vllm-omni wheel itself (no dependencies, nothing installed): the tests load vLLM-Omni's
# real prompt-interaction handler and read AsyncOmni's source from it. Keep the version equal to
# PINNED_VLLM_OMNI in rtvideo/backend/vllm_omni/ and the Dockerfile's VLLM_OMNI_VERSION.
VLLM_OMNI_VERSION=0.30.0
if [ ! -f ".venv/wheels/vllm_omni-$VLLM_OMNI_VERSION-py3-none-any.whl" ]; then
  "$VPY" -m pip download -q --no-deps --only-binary=:all: "vllm-omni==$VLLM_OMNI_VERSION" -d .venv/wheels
fi
echo "$want" > "$STAMP"
