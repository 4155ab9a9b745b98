#!/usr/bin/env bash
# Replicas to try on this machine (docs/operations.md "Trying replicas locally"): set-up
# (idempotent), then one Triton, N proxies sharing a redis-server, and HAProxy in front of them.
# Flags go to `rtvideo replicas` (see `.venv/bin/rtvideo replicas --help`); it needs Debian's
# redis-server and haproxy: `apt-get install -y redis-server haproxy`. Ctrl-C stops everything.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
for binary in redis-server haproxy; do
  command -v "$binary" >/dev/null 2>&1 || { echo "replicas.sh: $binary is not installed (apt-get install -y redis-server haproxy)" >&2; exit 1; }
done
exec .venv/bin/rtvideo replicas "$@"
