#!/usr/bin/env bash
# Creates .venv with everything the service and the tests need, from the package registries.
# Once set up, a second run changes nothing and needs no network: it compares a stamp of the
# inputs (this script, pyproject.toml, the interpreter) and returns at once when they match.
#
# The dependencies (torch, Triton, the test tools: ~2 GB, minutes to install) are installed once
# per user and set of inputs, in ${RTVIDEO_CACHE_DIR:-${XDG_CACHE_HOME:-~/.cache}/rtvideo}/venv-<hash
# of the dependency tables of pyproject.toml, this script's install section and the interpreter>,
# and a checkout's .venv is a small environment on top of it: its own interpreter links, a .pth
# that adds the cached environment's packages after its own, the console scripts (their first
# line pointed at .venv's python), and rtvideo itself installed editable from this checkout. A
# fresh clone (CI's) so sets up in seconds when an earlier one on the machine had the same
# dependencies. The cached environment is never changed once its stamp is written (an interrupted
# build is removed and built again; a lock keeps two set-ups from building it at once), so
# checkouts never see each other's code. A .venv made by an earlier version of this script (a
# whole environment, no .rtvideo-base in it) is kept and updated in place, as is one where the
# cache directory cannot be made.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VPY=.venv/bin/python
STAMP=.venv/.rtvideo-setup
if [ -x "$VPY" ] && [ -f "$STAMP" ]; then
  inputs=$(cat scripts/setup.sh pyproject.toml; "$VPY" -c 'import sys; print(sys.version)')
  if [ "$(cat "$STAMP")" = "$(printf '%s' "$inputs" | sha256sum | cut -d' ' -f1)" ]; then
    exit 0
  fi
fi
step() { printf 'setup: %s\n' "$*" >&2; }

# install_dependencies VPY LOG: torch, rtvideo's `test` extra and the wheels the tests read, into
# the environment of VPY (the cached one, or a .venv updated in place).
# --- install: what the cached environment's name covers
install_dependencies() {
  local vpy=$1 log=$2
  # A person sees one short line per step; pip's own output (setuptools' warnings about package
  # data included) goes to the log and is shown only when a step fails.
  quiet() {
    if ! "$@" >>"$log" 2>&1; then
      tail -n 40 "$log" >&2
      step "failed: $* (the whole log: $log)"
      return 1
    fi
  }
  quiet "$vpy" -m pip install -q --upgrade pip
  # CPU machines: take the CPU build of torch first (a plain "torch" would pull a multi-GB CUDA
  # build). The CPU build is what these machines' local wheel (2.13.0) is; elsewhere the package
  # index decides which build a "torch" in the range is (see the README's platform notes).
  if ! "$vpy" -c "import torch" 2>/dev/null; then
    if [ "$(uname -m)" = "x86_64" ] && ! command -v nvidia-smi >/dev/null 2>&1; then
      step "torch (CPU build)"
      "$vpy" -m pip install -q "torch==2.13.0" >>"$log" 2>&1 || quiet "$vpy" -m pip install -q "torch>=2.4,<2.15"
    else
      step "torch"
      quiet "$vpy" -m pip install -q "torch>=2.4,<2.15"
    fi
  fi
  step "rtvideo's dependencies and its test tools (Triton, PyAV, the text encoder)"
  quiet "$vpy" -m pip install -q -e ".[test]"
  # The vllm-omni wheel itself (no dependencies, nothing installed): the tests load vLLM-Omni's
  # real prompt-interaction handler and read AsyncOmni's source from it. Keep the version equal to
  # PINNED_VLLM_OMNI in rtvideo/backend/vllm_omni/ and the Dockerfile's VLLM_OMNI_VERSION.
  local wheels
  wheels=$(dirname "$(dirname "$vpy")")/wheels
  VLLM_OMNI_VERSION=0.30.0
  if [ ! -f "$wheels/vllm_omni-$VLLM_OMNI_VERSION-py3-none-any.whl" ]; then
    step "the vllm-omni $VLLM_OMNI_VERSION wheel (for the tests; not installed)"
    quiet "$vpy" -m pip download -q --no-deps --only-binary=:all: "vllm-omni==$VLLM_OMNI_VERSION" -d "$wheels"
  fi
  # vLLM-Omni 0.32.0rc1 (a release candidate) beside it, read by the tests of its protocol only
  # (tests/unit/core/test_coalescing_032.py): not installed, not the engine
  VLLM_OMNI_RC_VERSION=0.32.0rc1
  if [ ! -f "$wheels/vllm_omni-$VLLM_OMNI_RC_VERSION-py3-none-any.whl" ]; then
    step "the vllm-omni $VLLM_OMNI_RC_VERSION wheel (for the tests; not installed)"
    quiet "$vpy" -m pip download -q --no-deps --only-binary=:all: "vllm-omni==$VLLM_OMNI_RC_VERSION" -d "$wheels"
  fi
}
# --- end install

# Where the dependencies go: the cache, unless .venv is a whole environment of its own already.
BASE=""
if [ ! -e .venv ] || [ -f .venv/.rtvideo-base ]; then
  CACHE=${RTVIDEO_CACHE_DIR:-${XDG_CACHE_HOME:-${HOME:-/nonexistent}/.cache}/rtvideo}
  if mkdir -p "$CACHE" 2>/dev/null && [ -w "$CACHE" ]; then
    key=$( (sed -n '/^\[project\]/,/^\[project.scripts\]/p' pyproject.toml
      sed -n '/^# --- install/,/^# --- end install/p' scripts/setup.sh
      uname -m; command -v nvidia-smi >/dev/null 2>&1 && echo gpu
      "$PY" -c 'import sys; print(sys.version, sys.base_prefix)') | sha256sum | cut -d' ' -f1)
    BASE=$CACHE/venv-${key:0:16}
  else
    step "no cache directory ($CACHE cannot be made): everything is installed into .venv"
  fi
fi

if [ -z "$BASE" ]; then  # in place, as before the cache: pip brings .venv to the inputs
  [ -x "$VPY" ] || "$PY" -m venv .venv
  : >.venv/setup.log
  step "installing into .venv (the first run takes a few minutes; output in .venv/setup.log)"
  install_dependencies "$VPY" .venv/setup.log
else
  if command -v flock >/dev/null 2>&1; then
    exec 9>"$BASE.lock"  # one build of it at a time; released when the build is done
    flock 9
  fi
  if [ ! -f "$BASE/.rtvideo-base-done" ]; then
    rm -rf "$BASE"  # nothing, or a build that was interrupted
    step "installing the dependencies into $BASE (once for this machine; a few minutes; output in $BASE/setup.log)"
    "$PY" -m venv "$BASE"
    : >"$BASE/setup.log"
    install_dependencies "$BASE/bin/python" "$BASE/setup.log"
    "$BASE/bin/python" -m pip uninstall -q -y rtvideo >>"$BASE/setup.log" 2>&1  # each checkout has its own
    date -u +%FT%TZ >"$BASE/.rtvideo-base-done"
    # entries of the cache that no set-up used for 14 days (older dependencies)
    find "$CACHE" -maxdepth 2 -path "$CACHE/venv-*/.rtvideo-base-used" -mtime +14 | while read -r old; do
      step "removing $(dirname "$old") (unused for 14 days)"
      rm -rf "$(dirname "$old")" "$(dirname "$old").lock"
    done
  fi
  touch "$BASE/.rtvideo-base-used"
  exec 9>&-
  step "setting up .venv on $BASE"
  rm -rf .venv
  "$PY" -m venv --without-pip .venv
  echo "$BASE" >.venv/.rtvideo-base
  site=$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  base_site=$("$BASE/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  # after .venv's own packages (rtvideo), the cached ones, their own .pth files processed
  "$VPY" -c 'import sys; print("import site; site.addsitedir(%r)" % sys.argv[1])' "$base_site" >"$site/_rtvideo_base.pth"
  # the cached environment's console scripts and binaries (ruff, hadolint, ...); pip's are left
  # out, so that `.venv/bin/python -m pip` is the one way to install, and it installs into .venv
  for f in "$BASE"/bin/*; do
    name=$(basename "$f")
    case $name in python*|pip*|activate*|Activate*) continue ;; esac
    [ -e ".venv/bin/$name" ] && continue
    if head -n 1 "$f" | grep -qxF "#!$BASE/bin/python"; then  # a script: run by .venv's python, which sees rtvideo
      { echo "#!$PWD/$VPY"; tail -n +2 "$f"; } >".venv/bin/$name"
      chmod +x ".venv/bin/$name"
    else
      ln -s "$f" ".venv/bin/$name"
    fi
  done
  ln -s "$BASE/wheels" .venv/wheels
  : >.venv/setup.log
  step "rtvideo from this checkout (editable)"
  if ! "$VPY" -m pip install -q --no-deps -e . >>.venv/setup.log 2>&1; then
    tail -n 40 .venv/setup.log >&2
    step "failed: pip install -e . (the whole log: .venv/setup.log)"
    exit 1
  fi
fi
inputs=$(cat scripts/setup.sh pyproject.toml; "$VPY" -c 'import sys; print(sys.version)')
printf '%s' "$inputs" | sha256sum | cut -d' ' -f1 >"$STAMP"
step "done"
