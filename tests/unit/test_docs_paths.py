"""Every path the docs name exists: a module's dotted name (`rtvideo.proxy.session.upstream`, which
may end in a class, a function or a class's member), a file or folder from the repository's root
(`proxy/session/upstream.py`, `tests/e2e/test_resume.py`, `scripts/test.sh`) and a shorter file
path in backticks (`session/upstream.py`), read from docs/*.md and README.md; every link's file
and heading; every section a file cites (`docs/operations.md "Health"`); and the names
docs/architecture.md's "Who owns what" gives, defined where it says. Found by reading the source
(ast), never by importing it, so it runs without torch or Triton."""

from __future__ import annotations

import ast
import os
import re
import zipfile
from functools import cache
from pathlib import Path

from tests.support.paths import REPO_ROOT
from tests.support.vllm_omni_wheel import rc_wheel_path, wheel_path

#: the documents whose paths are checked
DOCS = (*sorted((REPO_ROOT / "docs").glob("*.md")), REPO_ROOT / "README.md")

#: the source folder of each installed package prefix (pyproject.toml's package-dir), longest first
PACKAGES = (("rtvideo.proxy", "proxy"), ("rtvideo.client", "client"), ("rtvideo", "rtvideo"))

#: folders at the repository's root that a path in the docs may start from
ROOT_FOLDERS = ("proxy", "rtvideo", "client", "tests", "scripts", "benchmarks", "deploy", "model_repository")

#: files the docs name that are not in this repository: what a store, a recording or a broadcast
#: writes, a model's own index, Triton's configuration inside a container, a file of vLLM-Omni's
#: tree outside its wheel (the wheel's own files are checked against the wheel: `wheel_files`)
NOT_OURS = frozenset(
    {
        "live.json",
        "broadcast.json",
        "manifest.json",
        "model_index.json",
        "configs/kubernetes.pbtxt",
        "examples/online_serving/streaming_video_generation/streaming_video_client.py",
    }
)

#: the installed name of the proxy's folder, which decisions.md says no folder holds
NOT_FOLDERS = frozenset({"rtvideo/proxy/"})

DOTTED = re.compile(r"(?<![\w./-])rtvideo(?:\.[A-Za-z_]\w*)+")
ROOTED = re.compile(r"(?<![\w./-])(?:" + "|".join(ROOT_FOLDERS) + r")/[\w./-]*")
SHORT = re.compile(r"`([\w.-]+(?:/[\w.-]+)*\.(?:py|md|js|html|css|sh|yaml|json|pbtxt|toml))`")


def mentions(pattern: re.Pattern[str], group: int = 0) -> list[tuple[str, int, str]]:
    """(document, line, text) of every match in the docs."""
    found = []
    for doc in DOCS:
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            found += [(doc.name, number, m.group(group)) for m in pattern.finditer(line)]
    return found


@cache
def repo_files() -> tuple[str, ...]:
    """The repository's files, less what tools and builds leave (a stale build/ would hold moved files)."""
    skip = {
        ".git",
        "__pycache__",
        "node_modules",
        ".mypy_cache",
        ".ruff_cache",
        ".pytest_cache",
        "build",
        "dist",
    }
    found = []
    for folder, subfolders, names in os.walk(REPO_ROOT):
        # .venv, .venv-real-engine: environments (one holds vLLM-Omni's tree only on some machines)
        subfolders[:] = [s for s in subfolders if s not in skip and not s.startswith(".venv")]
        found += [(Path(folder) / name).relative_to(REPO_ROOT).as_posix() for name in names]
    return tuple(found)


def module_file(dotted: str) -> Path | None:
    """The source file of the module `dotted` names (a package's __init__.py), or None."""
    for prefix, folder in PACKAGES:
        if dotted == prefix or dotted.startswith(prefix + "."):
            base = REPO_ROOT / folder / Path(*dotted.removeprefix(prefix).lstrip(".").split("."))
            for candidate in (base.with_suffix(".py"), base / "__init__.py"):
                if candidate.is_file():
                    return candidate
            return None
    return None


def defined_names(body: list[ast.stmt]) -> dict[str, ast.stmt]:
    """The names a module's or class's body binds (under `if` and `try` too), each to its node."""
    names: dict[str, ast.stmt] = {}
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names[node.name] = node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                names.update({n.id: node for n in ast.walk(target) if isinstance(n, ast.Name)})
        elif isinstance(node, ast.AnnAssign | ast.AugAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = node
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update({(a.asname or a.name).split(".")[0]: node for a in node.names})
        elif isinstance(node, ast.If | ast.Try):
            for block in (node.body, node.orelse, *(h.body for h in getattr(node, "handlers", ()))):
                names.update(defined_names(block))
    return names


def dotted_problem(dotted: str) -> str | None:
    """Why `dotted` names nothing: the longest prefix that is a module, then the rest defined
    in it (a top-level name, then a member of that class)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        path = module_file(".".join(parts[:cut]))
        if path is None:
            continue
        rest = parts[cut:]
        if not rest:
            return None
        names = defined_names(ast.parse(path.read_text()).body)
        if rest[0] not in names:
            return f"{'.'.join(parts[:cut])} defines no {rest[0]}"
        node = names[rest[0]]
        if len(rest) > 1 and isinstance(node, ast.ClassDef) and rest[1] not in defined_names(node.body):
            return f"{'.'.join(parts[: cut + 1])} has no member {rest[1]}"
        return None
    return "no such module"


@cache
def string_patterns() -> re.Pattern[str]:
    """Every string literal in our source, an f-string's fields as words: a span attribute such as
    `rtvideo.event_id` or `rtvideo.{field}_event_ids` is one."""
    found: set[str] = set()
    for _, folder in PACKAGES:
        for path in (REPO_ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.JoinedStr):
                    found.add(
                        "".join(re.escape(v.value) if isinstance(v, ast.Constant) else r"\w+" for v in node.values)
                    )
                elif (
                    isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("rtvideo.")
                ):
                    found.add(re.escape(node.value))
    return re.compile("|".join(sorted(p for p in found if p.startswith("rtvideo"))))


def test_every_dotted_module_path_exists() -> None:
    """A dotted name is a module (and a name in it), a span attribute the code writes, or one of
    the page's files (`rtvideo.js`)."""
    static = {p.name for p in (REPO_ROOT / "proxy" / "static").iterdir()}
    problems = []
    for doc, line, dotted in mentions(DOTTED):
        if dotted in static or string_patterns().fullmatch(dotted):
            continue
        if (why := dotted_problem(dotted)) is not None:
            problems.append(f"{doc}:{line}: {dotted}: {why}")
    assert problems == []


def test_every_path_from_the_root_exists() -> None:
    files = set(repo_files())
    folders = {str(Path(f).parent) for f in files} | {str(p) for f in files for p in Path(f).parents}
    problems = []
    for doc, line, text in mentions(ROOTED):
        path = text.rstrip(".")
        if path in NOT_FOLDERS or path.rstrip("/") in files or path.rstrip("/") in folders:
            continue
        problems.append(f"{doc}:{line}: {text}")
    assert problems == []


@cache
def wheel_files() -> tuple[str, ...]:
    """The files of the vLLM-Omni wheels the tests read (scripts/setup.sh downloads both), which
    docs/vllm-omni.md and docs/protocol.md cite by their path in vLLM-Omni's tree."""
    found: list[str] = []
    for wheel in (wheel_path(), rc_wheel_path()):
        with zipfile.ZipFile(wheel) as archive:
            found += archive.namelist()
    return tuple(found)


def test_every_shorter_file_path_ends_a_file_of_ours() -> None:
    """`session/upstream.py` names proxy/session/upstream.py: some file's path ends with it (or
    a file of the vLLM-Omni wheel's, `diffusion/diffusion_engine.py`)."""
    files = repo_files() + wheel_files()
    problems = []
    for doc, line, text in mentions(SHORT, 1):
        if text in NOT_OURS or any(f == text or f.endswith("/" + text) for f in files):
            continue
        problems.append(f"{doc}:{line}: {text}")
    assert problems == []


LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, code marks and punctuation dropped,
    spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.replace("`", "").strip().lower()).replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    """The anchors of a document's headings (outside code blocks); a repeated one gets `-1`, `-2`."""
    seen: dict[str, int] = {}
    found = set()
    fenced = False
    for line in doc.read_text().splitlines():
        fenced ^= line.startswith("```")
        if not fenced and (m := re.match(r"#+\s+(.*)", line)):
            anchor = slug(m.group(1))
            found.add(anchor if anchor not in seen else f"{anchor}-{seen[anchor]}")
            seen[anchor] = seen.get(anchor, 0) + 1
    return found


def test_every_link_names_a_file_and_heading_that_exist() -> None:
    """`[text](decisions.md#rooms-in-order-round-6)`: the file, and the heading the anchor names."""
    problems = []
    for doc, line, target in mentions(LINK, 1):
        if re.match(r"(https?|mailto):", target):
            continue
        path, _, anchor = target.partition("#")
        source = next(d for d in DOCS if d.name == doc)
        file = (source.parent / path).resolve() if path else source
        if not file.exists():
            problems.append(f"{doc}:{line}: {target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            problems.append(f"{doc}:{line}: {target}: no such heading")
    assert problems == []


def test_the_owners_architecture_md_names_define_what_it_says() -> None:
    """docs/architecture.md "Who owns what": each name a row gives (`Lifecycle`, `take_over`,
    `ProxySession._watch_lease`) is defined in a module that row names, at its top or in a class."""
    text = (REPO_ROOT / "docs" / "architecture.md").read_text()
    table = text.split("## Who owns what", 1)[1].split("\n## ", 1)[0]
    problems = []
    for row in (line for line in table.splitlines() if line.startswith("| ") and "`" in line):
        cells = row.strip("|").split("|")
        paths = re.findall(r"`((?:proxy|rtvideo)/[\w/]+\.py)`", "|".join(cells[1:]))
        names = [n for n in re.findall(r"`([A-Za-z_][\w.]*)`", "|".join(cells[1:])) if not n.endswith(".py")]
        defined: set[str] = set()
        for path in paths:
            body = defined_names(ast.parse((REPO_ROOT / path).read_text()).body)
            defined |= set(body)
            for name, node in body.items():
                if isinstance(node, ast.ClassDef):
                    defined |= {f"{name}.{member}" for member in defined_names(node.body)} | set(
                        defined_names(node.body)
                    )
        problems += [f"{cells[0].strip()}: {name}" for name in names if name not in defined]
    assert problems == []


SECTION = re.compile(r'(?:docs/)?([\w-]+\.md)[,:]?\s+"([^"\n]+)"')

#: the folders whose files may cite a section of the docs (`docs/operations.md "Health"`)
CITING = ("proxy", "rtvideo", "client", "tests", "scripts", "benchmarks", "deploy", "docs")


def sections(doc: Path) -> list[str]:
    """A document's headings (outside code blocks) and the bold leads of its paragraphs."""
    found = []
    fenced = False
    for line in doc.read_text().splitlines():
        fenced ^= line.startswith("```")
        if not fenced and (m := re.match(r"#+\s+(.*)", line)):
            found.append(m.group(1).replace("`", ""))
        found += re.findall(r"\*\*([^*]+?)\.?\*\*", line)
    return [s.lower() for s in found]


def test_every_cited_section_exists() -> None:
    """`docs/operations.md "Health"` in a docstring, a comment or a doc: that document has a
    heading (or a paragraph's bold lead) holding the words."""
    known = {doc.name: sections(doc) for doc in DOCS}
    problems = []
    for file in repo_files():
        if file.split("/")[0] not in CITING and file != "README.md":
            continue
        if not file.endswith((".py", ".md", ".sh", ".yaml", ".js", ".html")):
            continue
        for number, line in enumerate((REPO_ROOT / file).read_text(errors="replace").splitlines(), 1):
            for doc, section in SECTION.findall(line):
                if doc in known and not any(section.lower() in s for s in known[doc]):
                    problems.append(f'{file}:{number}: {doc} "{section}"')
    assert problems == []


def test_the_check_itself() -> None:
    """A module, a name in it and a class's member resolve; a missing one of each is named."""
    assert dotted_problem("rtvideo.proxy.session.upstream") is None
    assert dotted_problem("rtvideo.proxy.session.upstream.Upstream") is None
    assert dotted_problem("rtvideo.proxy.session.upstream.Upstream.send") is None
    assert dotted_problem("rtvideo.core") is None
    assert (
        dotted_problem("rtvideo.proxy.session.upstream.Nothing") == "rtvideo.proxy.session.upstream defines no Nothing"
    )
    assert dotted_problem("rtvideo.proxy.session.upstream.Upstream.nothing") == (
        "rtvideo.proxy.session.upstream.Upstream has no member nothing"
    )
    assert dotted_problem("rtvideo.nowhere.at_all") == "rtvideo defines no nowhere"
    assert slug("Broadcasts: a live window, the owner's to end (issue 49)") == (
        "broadcasts-a-live-window-the-owners-to-end-issue-49"
    )
    assert slug("9.6 Broadcasts: HLS for spectators") == "96-broadcasts-hls-for-spectators"
