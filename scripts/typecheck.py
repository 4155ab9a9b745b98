"""mypy over this checkout, every module under the name it is installed as.

pyproject.toml's package-dir installs `proxy/` as `rtvideo.proxy` and `client/` as
`rtvideo.client`. Handed those folders, mypy names their modules `proxy.*` and `client.*`, and the
`rtvideo.proxy.*` they import are nowhere on its path: no type checker follows the editable
install's import hook (docs/decisions.md, "Type checking the installed layout"). So mypy runs
here through its own API, with pyproject.toml's `files` and settings, and each source renamed as
installed: every import of ours resolves to the file checked, and messages carry the checkout's
paths. Arguments are mypy's (files instead of `files`, flags); scripts/typecheck.sh runs it.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import tomllib
from mypy import util
from mypy.fscache import FileSystemCache
from mypy.main import process_options, run_build
from mypy.modulefinder import BuildSource

ROOT = Path(__file__).resolve().parents[1]


def installed_as() -> dict[str, str]:
    """Each top-level folder installed under another name: `{"proxy": "rtvideo.proxy", ...}`."""
    package_dir = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    return {folder: package for package, folder in package_dir.items() if folder != package.replace(".", "/")}


def as_installed(source: BuildSource, names: dict[str, str]) -> BuildSource:
    """`source` under its installed module name (`proxy.app` → `rtvideo.proxy.app`)."""
    head, _, rest = (source.module or "").partition(".")
    path = Path(source.path).resolve() if source.path else None
    if head not in names or path is None or not path.is_relative_to(ROOT / head):
        return source
    return BuildSource(source.path, f"{names[head]}.{rest}" if rest else names[head], source.text, source.base_dir)


def main(argv: list[str]) -> int:
    started = time.time()
    fscache = FileSystemCache()
    # a cache of its own: one a plain `mypy` wrote holds these files under other module names
    config = ["--config-file", str(ROOT / "pyproject.toml"), "--cache-dir", str(ROOT / ".mypy_cache" / "installed")]
    sources, options = process_options([*config, *argv], fscache=fscache)
    names = installed_as()
    sources = [as_installed(source, names) for source in sources]
    _, messages, blockers = run_build(sources, options, fscache, started, sys.stdout, sys.stderr)
    formatter = util.FancyFormatter(sys.stdout, sys.stderr, options.hide_error_codes)
    errors, notes, files = util.count_stats(messages)
    if errors:
        print(formatter.format_error(errors, files, len(sources), blockers=blockers, use_color=False))
    elif notes == len(messages):
        print(formatter.format_success(len(sources), use_color=False))
    return (2 if blockers else 1) if notes < len(messages) else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
