"""What a reading of the source tree must show: every package ships, no import circle, a pure
core (docs/architecture.md). There is no bound on a file's lines (docs/decisions.md, "No size
rule")."""

from __future__ import annotations

import ast
from pathlib import Path

import tomllib

from tests.support.paths import REPO_ROOT

#: the source folders and the package each is installed as (pyproject.toml's package-dir)
ROOTS = {"rtvideo": "rtvideo", "proxy": "rtvideo.proxy", "client": "rtvideo.client"}


def modules() -> dict[str, Path]:
    found = {}
    for folder, package in ROOTS.items():
        for path in sorted((REPO_ROOT / folder).rglob("*.py")):
            if "__pycache__" in path.parts or "static" in path.parts:
                continue
            parts = path.relative_to(REPO_ROOT / folder).with_suffix("").parts
            name = ".".join([package, *parts])
            found[name.removesuffix(".__init__")] = path
    return found


def imports_of(path: Path, name: str, known: set[str]) -> set[str]:
    """The modules of ours `path` imports anywhere: at load, under `TYPE_CHECKING` and inside
    functions alike (a deferred or type-only import hides a circle; it does not remove it)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        else:
            continue
        out |= {t for t in targets if t in known and t != name}
    return out


def test_every_package_folder_is_installed() -> None:
    """A folder missing from pyproject's packages imports from a checkout but not from the
    image's `pip install .`."""
    listed = set(tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {name for name, path in modules().items() if path.name == "__init__.py"}
    assert sorted(folders - listed) == []
    # a folder of modules without an __init__.py is a namespace package setuptools leaves out
    for source in ROOTS:
        for folder in {p.parent for p in (REPO_ROOT / source).rglob("*.py") if "__pycache__" not in p.parts}:
            assert (folder / "__init__.py").exists(), f"{folder.relative_to(REPO_ROOT)} has no __init__.py"


def test_no_import_circle() -> None:
    mods = modules()
    graph = {name: imports_of(path, name, set(mods)) for name, path in mods.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for name in graph:
        if name not in index:
            visit(name)
    assert circles == []


def test_the_pure_core_imports_nothing_of_ours_outside_it() -> None:
    mods = modules()
    for name, path in mods.items():
        if name.startswith("rtvideo.core"):
            outside = {m for m in imports_of(path, name, set(mods)) if not m.startswith("rtvideo.core")}
            assert outside == set(), name
