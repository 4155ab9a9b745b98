#!/usr/bin/env bash
# The GPU check: one short script for a machine with an NVIDIA GPU. It proves each part it is
# asked for or fails: a part that cannot run (something it needs is missing) or whose assertions
# fail makes the whole check exit non-zero, naming the part and why. Never installs anything.
#
#   bash scripts/gpu_check.sh [--device cuda|cpu] [builtin] [vllm-omni] [lingbot-world]   # no part: all
#
# builtin (needs only Python with PyTorch and numpy; no tritonserver, no package registry): the
#   built-in generator rendering on the device, frames per second at each size of SIZES
#   (benchmarks/bench_generator.py; its encoder rows need PyAV, its new-prompt row the MiniLM
#   wheel: those rows are skipped, and said so, when missing), and rebuilds at chunk N frame-exact
#   on the device (tests/unit/backend/test_rebuild.py: needs pytest; replays and branches rely on
#   it), with the device's frames against the CPU's printed. On `--device cuda` (the default)
#   it needs a CUDA device; `--device cpu` runs it on the CPU (the check's own tests; never a
#   GPU figure).
# vllm-omni (Helios-Distilled) and lingbot-world (LingBot-World): each needs a CUDA device,
#   tritonserver, vLLM + vllm-omni of one major.minor, and the model's weights on disk (e.g. the
#   production image with the weights mounted): sessions of generator=vllm_omni through Triton,
#   asserting what benchmarks/bench_vllm_omni.py lists (versions agree without vLLM-Omni's
#   mismatch warning; exactly N frames at the model's size that decode; an update after the first
#   chunk started and completed within its transition; an early update held without error; stop
#   and disconnect abort the engine request; GPU memory flat across two sessions; real time: the
#   first chunk within the model's budget and the delivered fps at least the fps the docs promise
#   for the model), printing time to first chunk, generated fps and the engine's own rate beside
#   it. Nothing model-specific is written here: the size, frame counts, first frame, update kind
#   and promised fps are the rules table's (rtvideo/backend/vllm_omni/model_rules.py), printed
#   first as a `rules:` line (`bench_vllm_omni.py --show-rules`). The engine is warmed with one
#   session of the real size (WARMUP_CHUNKS chunks at the model's size and preset: the engine's own
#   warm-up is 512x512, 2 steps, stage 1; LingBot-World has none) before the first-chunk budget is asserted; that first session is
#   reported apart. Each part's `summary:` lines (first chunk, sustained fps, GPU memory peak:
#   the engine worker's torch max_memory_allocated, logged by vLLM-Omni at DEBUG, which this turns
#   on for the engine, its max_memory_reserved, and the device's, each against the rules table)
#   are repeated under `== Result`.
#   LingBot-World's deploy config is the one-H100 FP8 one on a GPU under 100 GB (nvidia-smi's
#   memory.total), the shipped H200 one otherwise (LINGBOT_DEPLOY_CONFIG overrides).
#
# Environment: PYTHON (the interpreter), HELIOS_MODEL (a Hugging Face id in the local cache, or a
# directory), LINGBOT_MODEL (a directory of LingBot-World's weights; no default),
# LINGBOT_DEPLOY_CONFIG (by the GPU's memory, above), CHUNKS, WARMUP_CHUNKS (1), EXTRA_PARAMS
# (Helios), ENGINE_ARGS (JSON, Helios), TRITONSERVER (its path when not on PATH nor from the
# nvidia-pytriton wheel), SIZES ("256x256 640x384", builtin only), SECONDS_PER_FIGURE (3).
# OMNI_STANDIN (tests only: module:callable of a stand-in engine): the vLLM-Omni parts run against
# it on whatever device there is, without vLLM or weights; their figures are then no GPU's.
set -uo pipefail
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
SIZES=${SIZES:-256x256 640x384}
HELIOS_MODEL=${HELIOS_MODEL:-BestWishYsh/Helios-Distilled}
LINGBOT_MODEL=${LINGBOT_MODEL:-}
WARMUP_CHUNKS=${WARMUP_CHUNKS:-1}
OMNI_STANDIN=${OMNI_STANDIN:-}
gpu_mib=
if [ -z "${LINGBOT_DEPLOY_CONFIG:-}" ]; then
  # one H100 (80 GB) needs FP8 for LingBot-World's weights beside its KV window (docs/vllm-omni.md)
  gpu_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1 | tr -dc '0-9')
  if [ -n "$gpu_mib" ] && [ "$gpu_mib" -gt 0 ] && [ "$gpu_mib" -lt 100000 ]; then
    LINGBOT_DEPLOY_CONFIG=deploy/gpu/lingbot_world_h100_fp8.yaml
  else
    LINGBOT_DEPLOY_CONFIG=deploy/gpu/lingbot_world_stepwise.yaml
  fi
fi

usage() {
  echo "usage: gpu_check.sh [--device cuda|cpu] [builtin] [vllm-omni] [lingbot-world]" >&2
  exit 2
}
DEVICE=cuda
parts=()
while [ $# -gt 0 ]; do
  case $1 in
    --device) [ $# -ge 2 ] || usage; DEVICE=$2; shift 2 ;;
    --device=*) DEVICE=${1#--device=}; shift ;;
    builtin|vllm-omni|lingbot-world) parts+=("$1"); shift ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "gpu_check: unknown part or option: $1" >&2; usage ;;
  esac
done
case $DEVICE in cpu|cuda|cuda:[0-9]*) ;; *) echo "gpu_check: --device must be cpu, cuda or cuda:N" >&2; usage ;; esac
[ ${#parts[@]} -gt 0 ] || parts=(builtin vllm-omni lingbot-world)

failed=()  # "part: why" of each part that did not prove what it was asked to
passed=()
summaries=()  # each vLLM-Omni part's `summary:` lines, repeated under == Result
cannot() {  # part, why: the part cannot run
  echo "gpu_check: part $1 CANNOT RUN: $2" >&2
  failed+=("$1: cannot run: $2")
}

# part, model, engine args (JSON), extra params: one model's sessions through Triton, its rules from
# the table; fails naming every missing piece, or the benchmark's failed assertions
omni_part() {
  local part=$1 model=$2 engine_args=$3 extra=$4
  echo "== Part $part: generator=vllm_omni through Triton"
  local why=() found versions reasons
  # what the sessions follow, from the rules table (needs only rtvideo: shown even where it cannot run)
  if ! "$PY" benchmarks/bench_vllm_omni.py --show-rules --model "${model:-unset}" --chunks "${CHUNKS:-5}" \
      --engine-args "$engine_args" --extra-params "$extra"; then
    why+=("its rules are not in rtvideo/backend/vllm_omni/model_rules.py for this model (above)")
  fi
  if [ -n "$OMNI_STANDIN" ]; then
    echo "(engine $OMNI_STANDIN: a stand-in, not vLLM-Omni; no figure here is a GPU figure)"
  else
    [ "$DEVICE" = cpu ] && why+=("it runs on CUDA only (--device cpu)")
    if [ $have_torch = 0 ]; then
      why+=("$torch_line")
    elif [ $have_cuda = 0 ]; then
      why+=("this PyTorch sees no CUDA device")
    fi
  fi
  # as the benchmark finds it: $TRITONSERVER, else PATH, else the nvidia-pytriton wheel
  if ! found=$("$PY" -c 'from rtvideo.triton.install import find_tritonserver as f; print(f().binary)' 2>&1); then
    why+=("$(echo "$found" | tail -1 | sed 's/^[A-Za-z]*Error: //')")
  fi
  if [ -n "$OMNI_STANDIN" ]; then
    :  # the stand-in needs neither vLLM nor weights
  elif ! versions=$("$PY" -c 'from importlib.metadata import version as v; print("vllm", v("vllm"), "vllm-omni", v("vllm-omni"))' 2>/dev/null); then
    why+=("vLLM and vllm-omni are not both installed for $PY")
  else
    echo "$versions"
  fi
  if [ -n "$OMNI_STANDIN" ]; then
    :
  elif [ -z "$model" ]; then
    why+=("no weights named (LINGBOT_MODEL=a directory of LingBot-World's weights)")
  elif ! "$PY" - "$model" >/dev/null 2>&1 <<'EOF'
import os, sys
model = sys.argv[1]
if not os.path.isdir(model):
    from huggingface_hub import snapshot_download
    snapshot_download(model, local_files_only=True)  # raises unless the weights are cached
EOF
  then
    why+=("the weights of $model are not on disk (a directory or a cached id)")
  fi
  if [ ${#why[@]} -gt 0 ]; then
    reasons=$(printf '%s; ' "${why[@]}")
    cannot "$part" "${reasons%; }"
    return
  fi
  local out engine=()
  [ -n "$OMNI_STANDIN" ] && engine=(--engine "$OMNI_STANDIN")
  out=$(mktemp)
  "$PY" benchmarks/bench_vllm_omni.py --model "${model:-standin}" --chunks "${CHUNKS:-5}" \
      --warmup-chunks "$WARMUP_CHUNKS" --extra-params "$extra" --engine-args "$engine_args" "${engine[@]}" \
      --allocated-peak --assert 2>&1 | tee "$out"
  local rc=${PIPESTATUS[0]}
  while IFS= read -r line; do summaries+=("$line"); done < <(grep '^summary: ' "$out")
  rm -f "$out"
  if [ "$rc" = 0 ]; then
    passed+=("$part")
  else
    echo "gpu_check: part $part FAILED: an assertion of bench_vllm_omni.py (above)" >&2
    failed+=("$part: bench_vllm_omni.py --assert failed")
  fi
}

echo "== GPU"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "(no nvidia-smi)"
torch_line=$("$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())' 2>&1) \
  || torch_line="no PyTorch for $PY: $(echo "$torch_line" | tail -1)"
echo "$torch_line"
have_torch=0; have_cuda=0
case $torch_line in torch\ *) have_torch=1 ;; esac
case $torch_line in *"available True") have_cuda=1 ;; esac

for part in "${parts[@]}"; do
  case $part in
  builtin)
    echo "== Part builtin: the built-in generator on $DEVICE"
    if [ $have_torch = 0 ]; then cannot builtin "$torch_line"; continue; fi
    if [ "$DEVICE" != cpu ] && [ $have_cuda = 0 ]; then
      cannot builtin "this PyTorch sees no CUDA device ($torch_line); --device cpu runs it on the CPU"
      continue
    fi
    [ "$DEVICE" = cpu ] && echo "(device cpu: these are CPU figures, not GPU figures)"
    ok=1
    for size in $SIZES; do
      if ! "$PY" benchmarks/bench_generator.py --device "$DEVICE" --width "${size%x*}" --height "${size#*x}" \
          --seconds "$SECONDS_PER_FIGURE"; then
        echo "gpu_check: part builtin FAILED: bench_generator.py at $size exited non-zero" >&2
        failed+=("builtin: bench_generator.py failed at $size")
        ok=0
        break
      fi
    done
    # replays and branches are exact only if rendering on the device is deterministic: the rebuild
    # tests on it (their one test that needs the test harness is left out; --noconftest likewise)
    if [ $ok = 1 ] && ! RTVIDEO_TEST_DEVICE=$DEVICE "$PY" -m pytest -q -p no:cacheprovider --noconftest \
        -k "not cannot_rebuild" tests/unit/backend/test_rebuild.py; then
      echo "gpu_check: part builtin FAILED: rebuilds on $DEVICE are not frame-exact (tests/unit/backend/test_rebuild.py)" >&2
      failed+=("builtin: rebuilds not exact on $DEVICE")
      ok=0
    fi
    [ $ok = 1 ] && passed+=("builtin on $DEVICE")
    ;;
  vllm-omni)
    omni_part vllm-omni "$HELIOS_MODEL" "${ENGINE_ARGS:-{\}}" "${EXTRA_PARAMS:-auto}"
    ;;
  lingbot-world)
    echo "(LingBot-World deploy config: $LINGBOT_DEPLOY_CONFIG${gpu_mib:+, a GPU of $gpu_mib MiB})"
    omni_part lingbot-world "$LINGBOT_MODEL" "{\"deploy_config\": \"$LINGBOT_DEPLOY_CONFIG\"}" auto
    ;;
  esac
done

echo "== Result"
for line in "${summaries[@]}"; do echo "$line"; done
for p in "${passed[@]}"; do echo "PASSED $p"; done
if [ ${#failed[@]} -gt 0 ]; then
  for f in "${failed[@]}"; do echo "FAILED $f"; done
  echo "gpu_check: ${#failed[@]} of ${#parts[@]} part(s) asked for did not prove out" >&2
  exit 1
fi
echo "gpu_check: all ${#parts[@]} part(s) asked for passed"
