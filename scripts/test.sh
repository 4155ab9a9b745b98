#!/usr/bin/env bash
# The test command of the README: set-up (idempotent) then the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Debian packages the tests drive: the browser test plays the stream in a real headless Chromium,
# the session store's tests start their own redis-server (tests/support/redis_server.py), and the
# local replicas recipe's test puts HAProxy in front of its proxies (tests/e2e/test_local_replicas.py).
# Serving needs none of them: scripts/setup.sh, which serve.sh runs too, installs no system package.
missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v haproxy >/dev/null 2>&1 || missing+=(haproxy)
if [ "${#missing[@]}" -gt 0 ] && command -v apt-get >/dev/null 2>&1; then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "installing ${missing[*]} for the tests (apt-get)"
  $sudo apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# The whole run (no arguments) first checks lint and format, in seconds (config: pyproject.toml);
# the types are checked beside pytest (below).
if [ "$#" -eq 0 ]; then
  echo "ruff check, ruff format --check"
  .venv/bin/ruff check .
  .venv/bin/ruff format --check .
fi
# The whole run builds vLLM-Omni's real-engine environment (~9 GB, once; docs/vllm-omni.md, "The
# real engine inside Triton") before pytest, whose tests/unit/backend/test_vllm_omni_real_engine_cpu.py
# drives that engine through the adapter and is skipped without it; then it drives the engine
# inside a real Triton: after pytest, or beside pytest's parallel workers (its own process group,
# its output printed after pytest's; most of its minutes are waits for its servers, which the
# workers fill; beside a serial run its start came with the browser tests, one of which failed). A
# machine that cannot build it says "real-engine: not run" and passes.
workers=${RTVIDEO_TEST_WORKERS:-0}
real_engine=""
mypy=""
if [ "$#" -eq 0 ]; then
  bash scripts/test_real_engine.sh --if-possible --install-only
  beside=$(mktemp -d "${TMPDIR:-/tmp}/rtvideo-beside.XXXXXX")
  # mypy (scripts/typecheck.sh, about a minute of one core) runs beside pytest; its report is
  # printed after pytest's, and a type error fails the run as a test does
  echo "mypy (scripts/typecheck.sh), beside pytest"
  bash scripts/typecheck.sh >"$beside/mypy.log" 2>&1 &
  mypy=$!
  if [ "$workers" != 0 ]; then
    setsid -w bash scripts/test_real_engine.sh --if-possible >"$beside/real-engine.log" 2>&1 &
    real_engine=$!
  fi
  # an interrupted run leaves none of them running (the real engine's servers are in its group)
  trap 'kill -TERM "$mypy" 2>/dev/null || true; [ -z "$real_engine" ] || kill -TERM -- "-$real_engine" 2>/dev/null || true; rm -rf "$beside"' EXIT
fi
# pytest serially, or in RTVIDEO_TEST_WORKERS parallel workers (pytest-xdist; 2 is the number that
# pays on 2 cores, not yet the default: under their load a test of the session store failed once
# and a Triton aborted once; docs/testing.md), each a test session with its own Triton, Redis and
# browser. A worker takes a whole group (`--dist loadgroup`): a file, so a module's fixtures stay
# in one process, or the files that share servers of their own (tests/conftest.py), longest
# folders first (its order, kept by `--no-loadscope-reorder`). Two, not three: under three on 2
# cores the render workers' SCHED_IDLE got no CPU (docs/testing.md, "Parallel workers"). The 25
# slowest tests are printed at the end: where the suite's time goes.
set +e
.venv/bin/python -m pytest -q -n "$workers" --dist loadgroup --no-loadscope-reorder --durations=25 "$@"
status=$?
set -e
# collect PID LOG: a check that ran beside pytest; its report after pytest's, and its failure the
# run's when pytest passed
collect() {
  set +e
  wait "$1"
  local code=$?
  set -e
  cat "$2"
  [ "$status" -ne 0 ] || status=$code
}
[ -z "$mypy" ] || collect "$mypy" "$beside/mypy.log"
if [ -n "$real_engine" ]; then
  collect "$real_engine" "$beside/real-engine.log"
elif [ "$#" -eq 0 ] && [ "$status" -eq 0 ]; then
  set +e
  bash scripts/test_real_engine.sh --if-possible
  status=$?
  set -e
fi
exit "$status"
