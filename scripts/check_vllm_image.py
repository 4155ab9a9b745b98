"""Build-time check of the vllm-omni image (Dockerfile, target vllm-omni): fails the build,
saying why, when

- a package of the lock (deploy/gpu/requirements.lock) is missing or at another version than
  the lock's (pip did not install what was resolved, or something replaced it),
- a requirement of vllm-omni or vLLM, or of anything they need (the whole dependency closure,
  with extras, markers evaluated for this Python and platform), is not met by what is installed,
- vLLM's major.minor differs from vllm-omni's (vllm-omni warns at import and breaks at run time).

Reads installed metadata only (importlib.metadata: no import of torch or vLLM, no GPU at build
time). Needs `packaging` (the image has it: vLLM requires it).

    python3 scripts/check_vllm_image.py deploy/gpu/requirements.lock
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib import metadata
from typing import cast

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

#: where the closure starts: what the image exists for
ROOTS = ("vllm-omni", "vllm")

#: the marker environment the lock was resolved for (NGC tritonserver:25.07-py3's Python); the
#: image itself is checked with its own (packaging's default_environment)
IMAGE_ENVIRONMENT = {
    "implementation_name": "cpython",
    "implementation_version": "3.12.3",
    "os_name": "posix",
    "platform_machine": "x86_64",
    "platform_python_implementation": "CPython",
    "platform_release": "",
    "platform_system": "Linux",
    "platform_version": "",
    "python_full_version": "3.12.3",
    "python_version": "3.12",
    "sys_platform": "linux",
}


@dataclass(frozen=True)
class Dist:
    """One installed distribution as the check needs it."""

    version: str
    requires: tuple[str, ...] = field(default=())


#: name -> the installed distribution, or None when nothing of that name is installed
Lookup = Callable[[str], "Dist | None"]


def installed(name: str) -> Dist | None:
    """The distribution of this Python's environment (importlib.metadata)."""
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return None
    return Dist(dist.version, tuple(dist.requires or ()))


def read_lock(text: str) -> dict[str, str]:
    """`name==version` of every entry of a pip requirements lock (hashes and comments skipped)."""
    pins: dict[str, str] = {}
    for line in text.replace("\\\n", " ").splitlines():
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith(("#", "-")):
            continue
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==([^\s;]+)", line)
        if m is None:
            raise ValueError(f"not a pinned requirement: {line!r}")
        pins[canonicalize_name(m.group(1))] = m.group(3)
    return pins


def unmet(
    roots: Iterable[str], lookup: Lookup, environment: dict[str, str] | None = None, *, recurse: bool = True
) -> list[str]:
    """Each requirement, reached from `roots` (requirement strings), that what `lookup` finds does
    not meet; with `recurse`, the requirements of what it finds too (with the extras asked)."""
    env: dict[str, str] = dict(environment) if environment is not None else cast(dict[str, str], default_environment())
    found: list[str] = []
    seen: set[tuple[str, str]] = set()
    todo: list[tuple[str, str]] = [(r, "") for r in roots]  # (requirement, who asked)
    while todo:
        text, by = todo.pop(0)
        req = Requirement(text)
        if not by and req.marker is not None and not req.marker.evaluate({**env, "extra": ""}):
            continue  # a root for another platform or Python, or for an extra nobody asked
        name = canonicalize_name(req.name)
        dist = lookup(name)
        who = f" (required by {by})" if by else ""
        if dist is None:
            found.append(f"{req} is not installed{who}")
            continue
        if req.specifier and not req.specifier.contains(Version(dist.version), prereleases=True):
            found.append(f"{req} is not met by {name} {dist.version}{who}")
        if not recurse:
            continue
        for extra in ("", *sorted(req.extras)):
            if (name, extra) in seen:
                continue
            seen.add((name, extra))
            for sub in dist.requires:
                sub_req = Requirement(sub)
                if sub_req.marker is None:
                    wanted = not extra
                else:
                    wanted = sub_req.marker.evaluate({**env, "extra": extra})
                    # a plain requirement is taken once (with extra ""), not again for each extra
                    if extra and sub_req.marker.evaluate({**env, "extra": ""}):
                        wanted = False
                if wanted:
                    todo.append((sub, f"{name} {dist.version}" + (f"[{extra}]" if extra else "")))
    return found


def problems(lock: dict[str, str], lookup: Lookup = installed, environment: dict[str, str] | None = None) -> list[str]:
    """What is wrong with this image (empty: nothing); `lock`: name -> version (read_lock)."""
    found = []
    for name, pinned in sorted(lock.items()):
        dist = lookup(name)
        if dist is None:
            found.append(f"{name} {pinned} of the lock is not installed")
        elif Version(dist.version) != Version(pinned):
            found.append(f"{name} {pinned} of the lock is {dist.version} in the image")
    found += unmet(ROOTS, lookup, environment)
    vllm, omni = lookup("vllm"), lookup("vllm-omni")
    if vllm is not None and omni is not None and Version(vllm.version).release[:2] != Version(omni.version).release[:2]:
        want = ".".join(map(str, Version(omni.version).release[:2]))
        found.append(
            f"vLLM {vllm.version} with vllm-omni {omni.version}: vllm-omni wants vLLM {want}.x "
            "(vllm-omni warns of the mismatch at import); set vllm in deploy/gpu/requirements.in "
            "and rerun scripts/lock_vllm_image.sh"
        )
    return found


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: check_vllm_image.py LOCK", file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        lock = read_lock(f.read())
    found = problems(lock)
    for problem in found:
        print(f"check_vllm_image: {problem}", file=sys.stderr)
    if found:
        return 1
    vllm, omni, torch = installed("vllm"), installed("vllm-omni"), installed("torch")
    print(
        f"check_vllm_image: {len(lock)} packages as locked; vLLM {vllm and vllm.version}, "
        f"vllm-omni {omni and omni.version}, torch {torch and torch.version}; "
        "every requirement of vllm-omni and vLLM (and of theirs) met"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
