"""What a reading of the source tree must show: every package ships, no import circle, a pure
core, and rooms whose imports only run down (docs/architecture.md; docs/decisions.md, "Rooms in
order"). There is no bound on a file's lines (docs/decisions.md, "No size rule")."""

from __future__ import annotations

import ast
from dataclasses import dataclass
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


# --- Rooms in order ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Room:
    """A group of modules with one job. `members`: `pkg.*` is the package `pkg` and every module
    under it; a name without `.*` is that one module alone."""

    name: str
    members: tuple[str, ...]
    why: str

    def holds(self, module: str) -> bool:
        for member in self.members:
            if member.endswith(".*"):
                base = member.removesuffix(".*")
                if module == base or module.startswith(base + "."):
                    return True
            elif module == member:
                return True
        return False


def room(name: str, *members: str, why: str) -> Room:
    return Room(name, members, why)


#: rtvideo's rooms, top to bottom. A module imports its own room and the rooms below it, never
#: one above; rooms in one tuple stand side by side and import neither each other.
RTVIDEO_ORDER: tuple[tuple[Room, ...], ...] = (
    (room("cli", "rtvideo.cli", why="the `rtvideo` command: parses flags and starts what they name"),),
    (room("replicas", "rtvideo.replicas", why="`rtvideo replicas`: one Triton, N proxies, Redis, HAProxy"),),
    (room("replicas_config", "rtvideo.replicas_config", why="what `rtvideo replicas` writes and probes"),),
    (
        room("client", "rtvideo.client.*", why="the Python clients and recorder; they borrow the proxy's TaskSet"),
        room("standalone", "rtvideo.standalone", why="`rtvideo triton`: one keyed tritonserver, model checked"),
    ),
    (room("proxy", "rtvideo.proxy.*", why="the WebSocket proxy; its own rooms are PROXY_ORDER"),),
    (
        room("loading", "rtvideo.backend.loading.*", why="the model's load: its settings and the composition root"),
        room("replay", "rtvideo.backend.replay.*", why="`rtvideo replay`: the built-in generator run in process"),
    ),
    (
        room("builtin", "rtvideo.backend.builtin.*", why="the built-in CPU generator"),
        room("vllm_omni", "rtvideo.backend.vllm_omni.*", why="the vLLM-Omni generator, its rules and presets"),
    ),
    (room("catalog", "rtvideo.backend.catalog", why="what each generator can produce, read by it and the loader"),),
    (room("runtime", "rtvideo.backend.runtime.*", why="the model's sessions, admission and dispatch"),),
    (room("media", "rtvideo.backend.media.*", why="a session's image in and fMP4 out"),),
    (room("logsetup", "rtvideo.logsetup", why="one escaped, bounded log format for every process"),),
    (room("triton", "rtvideo.triton.*", why="the Triton contract (key, wire) and a local tritonserver"),),
    (room("process", "rtvideo.process.*", why="child processes that die with their parent"),),
    (
        room("redaction", "rtvideo.redaction", why="what logs show instead of ids and secrets"),
        room("settings_text", "rtvideo.settings_text", why="settings as flags, environment and text"),
    ),
    (room("core", "rtvideo.core.*", why="the pure protocol: no I/O, the proxy and the model agree through it"),),
    # Python runs a package's __init__ before any module in it: importing anything there would
    # make every module of the package import it, so the roots sit at the bottom.
    (room("roots", "rtvideo", "rtvideo.backend", why="the package roots: docstrings, nothing imported"),),
)

#: the proxy's rooms, top to bottom (docs/architecture.md "The proxy's rooms"): what lives and
#: dies with one session above what outlives it; placement, recordings and the store below the
#: session, reached through narrow typed seams.
PROXY_ORDER: tuple[tuple[Room, ...], ...] = (
    (room("app", "rtvideo.proxy.app", why="the composition root: builds every part once"),),
    (room("edge", "rtvideo.proxy.edge.*", why="sockets, doors, HTTP routes and access: what a client meets"),),
    (room("session", "rtvideo.proxy.session.*", why="one session: its phase, steering, Triton stream, ending"),),
    (room("participants", "rtvideo.proxy.participants.*", why="seats, guest hubs, tokens and outboxes"),),
    (room("broadcasts", "rtvideo.proxy.broadcasts.*", why="a live window on a session, in any store"),),
    (room("recordings", "rtvideo.proxy.recordings.*", why="a session's recording and its index"),),
    (room("continuity", "rtvideo.proxy.continuity.*", why="what a takeover writes and reads"),),
    (room("settings", "rtvideo.proxy.settings", why="every proxy flag, declared once"),),
    (room("placement", "rtvideo.proxy.placement.*", why="the Tritons: addresses, supervision, streams"),),
    (room("store", "rtvideo.proxy.store.*", why="the session store: memory or Redis, leases"),),
    (room("observability", "rtvideo.proxy.observability.*", why="metrics, traces and the access log"),),
    (
        room(
            "base",
            "rtvideo.proxy.tasks",
            "rtvideo.proxy.frames",
            "rtvideo.proxy.phase",
            "rtvideo.proxy.limits",
            "rtvideo.proxy",
            why="small shared kinds every room may use; the package root",
        ),
    ),
)


def order_text(order: tuple[tuple[Room, ...], ...]) -> str:
    return " > ".join(", ".join(r.name for r in level) for level in order)


def room_problems(order: tuple[tuple[Room, ...], ...], prefix: str) -> list[str]:
    """Every module under `prefix` placed in exactly one room, every room naming only modules that
    exist, and every import between modules under `prefix` running down the order."""
    mods = modules()
    known = set(mods)
    ours = {name for name in mods if name == prefix or name.startswith(prefix + ".")}
    level_of = {r.name: depth for depth, level in enumerate(order) for r in level}
    problems: list[str] = []
    home: dict[str, Room] = {}
    for name in sorted(ours):
        rooms = [r for level in order for r in level if r.holds(name)]
        if len(rooms) != 1:
            named = ", ".join(r.name for r in rooms) or "no room"
            problems.append(f"{name} is in {named}: place it in one room of the order")
        else:
            home[name] = rooms[0]
    for level in order:
        for r in level:
            for member in r.members:
                base = member.removesuffix(".*")
                if base not in known:
                    problems.append(f"room {r.name} names {member}, which does not exist")
    for name in sorted(home):
        here = home[name]
        for target in sorted(imports_of(mods[name], name, known) & set(home)):
            there = home[target]
            if there is here:
                continue
            if level_of[there.name] < level_of[here.name]:
                problems.append(f"{name} -> {target}: {here.name} imports {there.name}, a room above it")
            elif level_of[there.name] == level_of[here.name]:
                problems.append(f"{name} -> {target}: {here.name} and {there.name} stand side by side")
    return problems


def test_rtvideo_imports_run_down_its_rooms() -> None:
    """rtvideo's rooms in one order, deferred and type-only imports included (see `imports_of`)."""
    problems = room_problems(RTVIDEO_ORDER, "rtvideo")
    assert problems == [], f"rooms: {order_text(RTVIDEO_ORDER)}\n" + "\n".join(problems)


def test_proxy_imports_run_down_its_rooms() -> None:
    """The proxy's rooms in one order: no room imports one above it."""
    problems = room_problems(PROXY_ORDER, "rtvideo.proxy")
    assert problems == [], f"rooms: {order_text(PROXY_ORDER)}\n" + "\n".join(problems)


def test_a_module_outside_every_room_is_named() -> None:
    """The check itself: a module no room holds, an import up and one sideways are each reported."""
    order = (
        (room("top", "rtvideo.cli", why="t"),),
        (room("left", "rtvideo.core.*", why="l"), room("right", "rtvideo.triton.*", why="r")),
    )
    problems = room_problems(order, "rtvideo")
    assert "rtvideo.logsetup is in no room: place it in one room of the order" in problems
    assert "rtvideo.triton.wire -> rtvideo.core: right and left stand side by side" in problems
    assert room_problems(((room("x", "rtvideo.nowhere", why="n"),),), "rtvideo.nowhere") == [
        "room x names rtvideo.nowhere, which does not exist"
    ]
    upside_down = ((room("core", "rtvideo.core.*", why="c"),), (room("triton", "rtvideo.triton.*", why="t"),))
    assert "rtvideo.triton.wire -> rtvideo.core: triton imports core, a room above it" in [
        p for p in room_problems(upside_down, "rtvideo") if p.startswith("rtvideo.triton.wire")
    ]
