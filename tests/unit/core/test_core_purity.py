"""The pure core stays pure: no I/O, no framework imports, so the backend and the proxy share it."""

from __future__ import annotations

import ast

from tests.support.paths import REPO_ROOT

CORE = REPO_ROOT / "rtvideo" / "core"
FORBIDDEN_MODULES = {
    "tornado",
    "tritonclient",
    "triton_python_backend_utils",
    "torch",
    "numpy",
    "av",
    "socket",
    "asyncio",
    "threading",
    "subprocess",
    "os",
    "io",
    "pathlib",
    "urllib",
    "logging",
}
FORBIDDEN_CALLS = {"open", "print", "input"}


def test_core_has_no_io_or_framework_imports() -> None:
    files = sorted(CORE.rglob("*.py"))  # packages too (`interaction/`)
    assert len(files) >= 6 and CORE / "interaction" / "parse.py" in files
    for path in files:
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                names = []
            for name in names:
                assert name.split(".")[0] not in FORBIDDEN_MODULES, f"{path.relative_to(CORE)} imports {name}"
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id not in FORBIDDEN_CALLS, f"{path.relative_to(CORE)} calls {node.func.id}()"
