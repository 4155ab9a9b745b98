#!/usr/bin/env bash
# The real engine, end to end, on a CPU: vLLM-Omni 0.30.0's own AsyncOmni loaded INSIDE a real
# tritonserver's Python-backend stub (`rtvideo serve --generator vllm_omni`, this checkout's
# model repository), driven through the WebSocket proxy by tests/real_engine/drive.py. Ends
# with one line `real-engine: N passed, M failed`; exits non-zero on any failure.
#
#   bash scripts/test_real_engine.sh                 # build (first run) or reuse the env, then run
#   bash scripts/test_real_engine.sh --install-only  # build or check the env only
#   bash scripts/test_real_engine.sh --keep DIR --only prompt_updates  # keep models and logs; one check
#   bash scripts/test_real_engine.sh --if-possible   # as scripts/test.sh runs it: a machine without
#                                                    # CPython 3.12 or the disk says "not run" and passes
#   bash scripts/test_real_engine.sh --lock 0.32     # the same on vLLM-Omni 0.32.0rc1 (release
#                                                    # candidate): deploy/gpu/vllm-omni-0.32's lock in
#                                                    # .venv-real-engine-032; on demand only, never by
#                                                    # scripts/test.sh (CI builds the 0.30 one alone)
#
# scripts/test.sh (so .ci/run) builds the environment with `--if-possible --install-only` before
# pytest (so that pytest's tests/unit/backend/test_vllm_omni_real_engine_cpu.py finds it and
# runs) and runs the checks after: building the ~9.3 GB environment from nothing took 5.2
# minutes here and a run about 3 (docs/vllm-omni.md, "The real engine inside Triton").
#
# The environment is built once from deploy/gpu/requirements.lock, hash-checked, for CPython 3.12
# (the lock's Python; PYTHON312 names one, else python3.12 on PATH, else pyenv's), and reused by
# every checkout while its inputs are unchanged: the lock, this script's install section and the
# pins it installs beside the lock, and the interpreter (a sha256 of all of them). It lives in the
# user's cache, ${RTVIDEO_CACHE_DIR:-${XDG_CACHE_HOME:-~/.cache}/rtvideo}/real-engine-<hash>, and
# the checkout's .venv-real-engine (git-ignored) is a link to it, so a fresh clone (CI's) builds
# nothing when an earlier run on the machine built the same inputs. A stamp written after the last
# install step marks it complete: an interrupted build is removed and built again, never reused; a
# lock (flock) keeps two checkouts from building or running on one environment at once; entries
# unused for 14 days are removed when a new one is built. RTVIDEO_REAL_ENGINE_ENV=DIR builds and
# keeps it in DIR instead (no cache, no link), as does a cache directory that cannot be made.
# Differences from the GPU image, all in that env only:
#  - numpy 1.26.4 instead of the lock's 2.3.5: the pip Triton's stub (nvidia-pytriton 0.7.0,
#    Triton 2.51) decodes BYTES tensors wrongly under numpy 2 (NGC's stub does not); so scipy
#    1.16.3 instead of 1.18.1, whose import fails under numpy 1 (vLLM-Omni imports it through
#    transformers); opencv-python 5.0 and tifffile declare numpy>=2 but are not on this path;
#  - nvidia-pytriton 0.7.0 (the tritonserver binary; NGC images have it on PATH), pytest (the
#    WebSocket helpers of tests/support use it) and rtvideo itself (editable, from this checkout);
#  - tests/real_engine/cpu_platform.py copied in with a .pth that installs it in every process of
#    the env (the stub's interpreter and the engine's spawned workers): vLLM-Omni 0.30 has no CPU
#    platform; the patches are applied when vLLM-Omni's own modules are imported and never touch
#    rtvideo (docs/vllm-omni.md, "The real engine on a CPU", lists them).
# The models are tiny random ones written at each run (diffusers' and vLLM-Omni's own classes).
set -euo pipefail
cd "$(dirname "$0")/.."
LOCK=deploy/gpu/requirements.lock
DEFAULT_ENV_DIR=.venv-real-engine
# in place of the lock's numpy 2.3.5 and scipy 1.18.1 (which needs numpy 2): see below
OVERRIDES="numpy==1.26.4 scipy==1.16.3"
PYTRITON=nvidia-pytriton==0.7.0
NEEDED_GB=12  # the environment is 9.3 GB; pip unpacks beside it
PYTEST=pytest==9.2.0  # tests/support's clients use pytest.raises (with its own small dependencies)

install_only=0
if_possible=0
while [ $# -gt 0 ]; do  # leading flags of this script, in any order
  case $1 in
    --install-only) install_only=1; shift ;;
    --if-possible) if_possible=1; shift ;;
    --lock)  # another image's lock: its own environment beside the default one
      case ${2:-} in
        0.30) shift 2 ;;
        0.32) LOCK=deploy/gpu/vllm-omni-0.32/requirements.lock; DEFAULT_ENV_DIR=.venv-real-engine-032; shift 2 ;;
        *) echo "test_real_engine: --lock takes 0.30 or 0.32" >&2; exit 2 ;;
      esac ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) break ;;  # the rest goes to the driver (--keep DIR, --only CHECK)
  esac
done

say() { echo "test_real_engine: $*" >&2; }

# What this machine lacks for the run: with --if-possible (scripts/test.sh) a clear "not run"
# line and success; otherwise a failure.
cannot_run() {
  if [ $if_possible = 1 ]; then
    echo "real-engine: not run ($*)"
    exit 0
  fi
  say "$*"
  echo "real-engine: 0 passed, 1 failed"
  exit 1
}

find_python312() {  # $PYTHON312, else a working python3.12 on PATH, else pyenv's
  local c
  for c in ${PYTHON312:-} python3.12 "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3.12; do
    if [ -n "$c" ] && "$c" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; then
      echo "$c"
      return
    fi
  done
}
PY312=$(find_python312)
[ -n "$PY312" ] || cannot_run "needs CPython 3.12, the lock's Python: set PYTHON312 or put python3.12 on PATH"
want=$( (cat "$LOCK"; echo "$OVERRIDES $PYTRITON $PYTEST"; sed -n '/^# --- install/,/^# --- end install/p' "$0"
  "$PY312" -c 'import sys; print(sys.version, sys.base_prefix)') | sha256sum | cut -d' ' -f1)

LINK=""  # the checkout's link to the cached environment, when it is in the cache
if [ -n "${RTVIDEO_REAL_ENGINE_ENV:-}" ]; then
  ENV_DIR=$RTVIDEO_REAL_ENGINE_ENV
else
  CACHE=${RTVIDEO_CACHE_DIR:-${XDG_CACHE_HOME:-${HOME:-/nonexistent}/.cache}/rtvideo}
  if mkdir -p "$CACHE" 2>/dev/null && [ -w "$CACHE" ]; then
    ENV_DIR=$CACHE/real-engine-${want:0:16}
    LINK=$DEFAULT_ENV_DIR
  else
    say "no cache directory ($CACHE cannot be made): the environment is built in the checkout"
    ENV_DIR=$DEFAULT_ENV_DIR
  fi
fi
if [ -n "$LINK" ] && command -v flock >/dev/null 2>&1; then
  exec 9>"$ENV_DIR.lock"  # held until this script exits: one build or run on it at a time
  flock 9
fi

if [ -f "$ENV_DIR/.real-engine-stamp" ] && [ "$(cat "$ENV_DIR/.real-engine-stamp")" = "$want" ]; then
  say "environment $ENV_DIR is up to date (reused)"
  touch "$ENV_DIR/.real-engine-stamp"  # its last use, for the clean-up of unused entries
else
# --- install: what the stamp covers
  if [ -n "$LINK" ] && [ -e "$ENV_DIR" ]; then  # a cached build that never finished
    say "removing $ENV_DIR (an interrupted build)"
    rm -rf "$ENV_DIR"
  fi
  parent=$(dirname "$ENV_DIR")
  free_gb=$(df -Pk "$parent" | awk 'NR==2 {print int($4 / 1048576)}')
  [ "$free_gb" -ge "$NEEDED_GB" ] || cannot_run "needs ${NEEDED_GB} GB free for its environment, $parent has ${free_gb} GB"
  t0=$(date +%s)
  say "building $ENV_DIR from $LOCK (first run: ~9 GB)"
  [ -x "$ENV_DIR/bin/python" ] || "$PY312" -m venv "$ENV_DIR"  # in place, a changed lock: pip brings the env to it
  # the lock without the overridden packages, hashes checked, no resolver: the GPU image's install
  names=$(for o in $OVERRIDES; do printf '%s|' "${o%%==*}"; done)
  awk -v names="^(${names%|})==" 'BEGIN{skip=0} $0 ~ names {skip=1; next} skip && /^[ \t]/{next} {skip=0; print}' \
    "$LOCK" > "$ENV_DIR/requirements.real-engine.lock"
  "$ENV_DIR/bin/python" -m pip install -q --no-cache-dir --no-deps --require-hashes \
    -r "$ENV_DIR/requirements.real-engine.lock"
  # shellcheck disable=SC2086  # one word per requirement
  "$ENV_DIR/bin/python" -m pip install -q --no-cache-dir --no-deps $OVERRIDES "$PYTRITON"
  "$ENV_DIR/bin/python" -m pip install -q --no-cache-dir "$PYTEST"  # adds pluggy and iniconfig only
  echo "$want" > "$ENV_DIR/.real-engine-stamp"
  say "environment built in $(( $(date +%s) - t0 )) s ($(du -sh "$ENV_DIR" | cut -f1))"
# --- end install
  if [ -n "$LINK" ]; then  # entries of the cache unused for 14 days (another lock, older inputs)
    find "$CACHE" -maxdepth 2 -path "$CACHE/real-engine-*/.real-engine-stamp" -mtime +14 | while read -r old; do
      say "removing $(dirname "$old") (unused for 14 days)"
      rm -rf "$(dirname "$old")" "$(dirname "$old").lock"
    done
  fi
fi
if [ -n "$LINK" ] && [ "$(readlink "$LINK" 2>/dev/null)" != "$ENV_DIR" ]; then
  if [ -d "$LINK" ] && [ ! -L "$LINK" ]; then
    say "removing $LINK (built in the checkout by an earlier version of this script; now in $CACHE)"
    rm -rf "$LINK"
  fi
  ln -sfn "$ENV_DIR" "$LINK"
fi
# the CPU platform, refreshed each run (not part of the stamp: an edit needs no rebuild)
site=$("$ENV_DIR/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
cp tests/real_engine/cpu_platform.py "$site/rtvideo_real_engine_cpu.py"
echo "import rtvideo_real_engine_cpu; rtvideo_real_engine_cpu.install()" > "$site/rtvideo_real_engine_cpu.pth"
# rtvideo from this checkout (editable, no dependencies: the lock has them), as the image installs it;
# a cached environment another checkout used points at that one's (-I: not this directory's
# rtvideo/ by way of the current directory, the installed one)
if ! "$ENV_DIR/bin/python" -I -c 'import sys, rtvideo.proxy; sys.exit(not rtvideo.proxy.__file__.startswith(sys.argv[1] + "/"))' "$PWD" 2>/dev/null; then
  "$ENV_DIR/bin/python" -m pip install -q --no-deps --no-build-isolation -e .
fi
[ $install_only = 1 ] && exit 0

export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # rtvideo and tests/ from this checkout
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
t0=$(date +%s)
set +e
"$ENV_DIR/bin/python" -m tests.real_engine.drive "$@" 9>&-  # the lock stays with this script
rc=$?
set -e
say "run took $(( $(date +%s) - t0 )) s"
exit $rc
