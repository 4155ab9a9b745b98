#!/usr/bin/env bash
# Regenerates deploy/gpu/requirements.lock, the vllm-omni image's dependency lock (Dockerfile,
# target vllm-omni), from deploy/gpu/requirements.in: pip's own resolver, run on this machine for
# the image's Python and platform (NGC tritonserver:25.07-py3: CPython 3.12, Ubuntu 24.04 with
# glibc 2.39, x86_64), wheels only (but for SDIST_ONLY, below). pip reads each candidate's
# metadata (PEP 658 where the index serves it) and downloads no wheel it does not have to.
#
#   bash scripts/lock_vllm_image.sh          # needs https://pypi.org and a CPython 3.12 (below)
#   bash scripts/lock_vllm_image.sh deploy/gpu/vllm-omni-0.32   # the 0.32 release candidate's lock
#                                            # (the Dockerfile's --build-arg VLLM_OMNI_LOCK=0.32)
#
# Writes, next to requirements.in:
#   requirements.lock        name==version --hash=sha256:... for every package pip chose, by name
#   vllm-<version>.METADATA  vLLM's core metadata (Name, Version, Requires-Python, Requires-Dist)
#                            as the index serves it, so tests/deploy/test_vllm_lock.py can check
#                            the lock against vLLM's requirements offline (vllm-omni's come from
#                            the pinned wheel in .venv/wheels)
# pip runs --isolated (no pip.conf, no PIP_* variables: no local wheel directory, no constraint
# file of this machine leaks into the image's lock) against PyPI alone.
set -euo pipefail
cd "$(dirname "$0")/.."
# pip evaluates the dependencies' environment markers (python_version > "3.11", sys_platform, ...)
# with the interpreter it runs on, whatever --python-version says: so it must run on CPython 3.12
# on Linux x86_64, like the image's Python (PYTHON=... to name one; otherwise python3.12 on PATH).
PY=${PYTHON:-$(command -v python3.12 || true)}
if [ -z "$PY" ] || ! "$PY" -c 'import platform, sys
sys.exit(not (sys.version_info[:2] == (3, 12) and sys.implementation.name == "cpython"
              and sys.platform == "linux" and platform.machine() == "x86_64"))'; then
  echo "lock_vllm_image: needs CPython 3.12 on Linux x86_64 with pip (PYTHON=/path/to/python3.12)" >&2
  exit 1
fi
DIR=${1:-deploy/gpu}  # the directory holding requirements.in; the lock and METADATA go beside it
[ -f "$DIR/requirements.in" ] || { echo "lock_vllm_image: no $DIR/requirements.in" >&2; exit 1; }
INDEX_URL=${INDEX_URL:-https://pypi.org/simple}
CERT=${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
REPORT=$WORK/report.json
# Releases that PyPI has as source only (no wheel): built here into a pure-Python wheel so the
# wheels-only resolver can read their metadata; the lock records the PyPI source archive's hash
# (the image builds it: `pip install` without --only-binary). Pinned in requirements.in.
SDIST_ONLY=${SDIST_ONLY:-openai-whisper}

# Ubuntu 24.04's glibc is 2.39: every manylinux tag it accepts, newest first, and the legacy aliases.
platforms=()
for minor in $(seq 39 -1 17); do platforms+=(--platform "manylinux_2_${minor}_x86_64"); done
platforms+=(--platform manylinux2014_x86_64 --platform linux_x86_64)

cert=()
[ -f "$CERT" ] && cert=(--cert "$CERT")

# A current pip for that Python, in a throwaway environment (older pips refuse --platform without
# --target and lack parts of the report).
"$PY" -m venv "$WORK/venv"
"$WORK/venv/bin/python" -m pip --isolated install --quiet --disable-pip-version-check "${cert[@]}" \
  --index-url "$INDEX_URL" --upgrade "pip>=25.1"
PY=$WORK/venv/bin/python

mkdir -p "$WORK/sdist" "$WORK/wheels"
for name in $SDIST_ONLY; do
  spec=$(grep -iE "^${name}==" "$DIR/requirements.in") || { echo "lock_vllm_image: pin $name in requirements.in" >&2; exit 1; }
  "$PY" -m pip --isolated download --quiet --disable-pip-version-check "${cert[@]}" --index-url "$INDEX_URL" --no-deps \
    --no-binary :all: -d "$WORK/sdist" "$spec"
done
for archive in "$WORK"/sdist/*; do
  [ -e "$archive" ] || continue
  "$PY" -m pip --isolated wheel --quiet --disable-pip-version-check "${cert[@]}" --index-url "$INDEX_URL" --no-deps \
    -w "$WORK/wheels" "$archive"
done

"$PY" -m pip --isolated install --dry-run --ignore-installed --quiet --disable-pip-version-check --report "$REPORT" \
  "${cert[@]}" --index-url "$INDEX_URL" \
  --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none \
  "${platforms[@]}" --only-binary=:all: \
  --find-links "$WORK/wheels" -r "$DIR/requirements.in"

"$PY" - "$REPORT" "$DIR" "$("$PY" -m pip --version | cut -d' ' -f2)" "$WORK/sdist" <<'PYEOF'
import hashlib
import json
import os
import sys
from datetime import datetime, timezone

report_file, out_dir, pip_version, sdist_dir = sys.argv[1:5]


def canonical(name):
    return name.lower().replace("_", "-").replace(".", "-")


sdists = {}  # canonical name -> (file, sha256) of the PyPI source archives built here
for file in os.listdir(sdist_dir):
    with open(os.path.join(sdist_dir, file), "rb") as f:
        sdists[canonical(file.rsplit("-", 1)[0])] = (file, hashlib.sha256(f.read()).hexdigest())
with open(report_file) as f:
    report = json.load(f)
items = report["install"]
omni = next((i["metadata"]["version"] for i in items if i["metadata"]["name"].lower() == "vllm-omni"), "")
lines = []
if any(tag in omni for tag in ("rc", "a", "b", "dev")):  # a pre-release: said on the first line
    lines.append(f"# RELEASE CANDIDATE: vllm-omni {omni} is a pre-release; not the default image.")
lines += [
    "# The vllm-omni image's dependency lock: GENERATED by scripts/lock_vllm_image.sh from",
    "# requirements.in (do not edit; rerun the script). pip's resolver, for CPython 3.12 on",
    "# manylinux x86_64 (glibc 2.39), wheels only:",
    f"#   pip {pip_version}, {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {len(items)} packages",
    "# The Dockerfile installs it with `pip install --no-deps --require-hashes -r requirements.lock`",
    "# (wheels for all but the source-only releases marked below, which pip builds) and",
    "# scripts/check_vllm_image.py checks the result; tests/deploy/test_vllm_lock.py checks that it",
    "# satisfies vllm-omni's requirements (its wheel) and vLLM's (the METADATA file next to it).",
]
vllm_meta = None
for item in sorted(items, key=lambda i: i["metadata"]["name"].lower()):
    meta = item["metadata"]
    name, ver = meta["name"], meta["version"]
    info = item["download_info"]
    hashes = info.get("archive_info", {}).get("hashes") or {}
    if info["url"].startswith("file:"):  # a wheel built here from PyPI's source archive
        file, digest = sdists[canonical(name)]
        hashes = {"sha256": digest}
        info = {"url": file + " (source; PyPI has no wheel)"}
    if "sha256" not in hashes:
        sys.exit(f"lock_vllm_image: no sha256 for {name} {ver} in pip's report")
    lines.append(f"{name}=={ver} \\")
    lines.append(f"    --hash=sha256:{hashes['sha256']}")
    lines.append(f"    # {info['url'].rsplit('/', 1)[-1]}")
    if name.lower() == "vllm":
        vllm_meta = meta
# pip does not allow a comment line between continuation lines: put the file name after the hash.
out = []
for line in lines:
    if line.startswith("    # ") and out:
        out[-1] = out[-1] + "  " + line.strip()
    else:
        out.append(line)
with open(f"{out_dir}/requirements.lock", "w") as f:
    f.write("\n".join(out) + "\n")
if vllm_meta is None:
    sys.exit("lock_vllm_image: vllm is not in pip's report")
meta_lines = [
    "Metadata-Version: " + vllm_meta.get("metadata_version", "2.1"),
    "Name: " + vllm_meta["name"],
    "Version: " + vllm_meta["version"],
]
if vllm_meta.get("requires_python"):
    meta_lines.append("Requires-Python: " + vllm_meta["requires_python"])
meta_lines += ["Requires-Dist: " + r for r in vllm_meta.get("requires_dist", [])]
meta_lines += ["Provides-Extra: " + e for e in vllm_meta.get("provides_extra", [])]
with open(f"{out_dir}/vllm-{vllm_meta['version']}.METADATA", "w") as f:
    f.write("\n".join(meta_lines) + "\n")
print(f"lock_vllm_image: {len(items)} packages, vllm {vllm_meta['version']} -> {out_dir}/requirements.lock")
PYEOF
