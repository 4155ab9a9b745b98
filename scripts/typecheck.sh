#!/usr/bin/env bash
# mypy over the package as it is installed: `proxy/` is `rtvideo.proxy` and `client/` is
# `rtvideo.client` (pyproject.toml's package-dir), which mypy cannot map by itself. Checked in
# place, their modules would be `proxy.*` and every `rtvideo.proxy.*` import an unchecked Any;
# so the package is checked through a tree of links in the installed layout, then the scripts,
# benchmarks and the Triton model (the `files` of pyproject.toml) as they are. Paths in the
# messages are the checkout's.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT
mkdir "$tree/rtvideo"
for entry in rtvideo/*; do
  [ "$(basename "$entry")" = "__pycache__" ] || ln -s "$root/$entry" "$tree/rtvideo/"
done
ln -s "$root/proxy" "$tree/rtvideo/proxy"
ln -s "$root/client" "$tree/rtvideo/client"
status=0
(cd "$tree" && "$root/.venv/bin/mypy" --config-file "$root/pyproject.toml" --cache-dir "$root/.mypy_cache/package" rtvideo) \
  | sed -e "s#^rtvideo/proxy/#proxy/#" -e "s#^rtvideo/client/#client/#" || status=$?
.venv/bin/mypy || status=$?
exit $status
