"""Build-time check of the vllm_omni image (Dockerfile): fails the build, saying why, when

- vLLM's major.minor differs from vllm-omni's (vllm-omni warns at import and breaks at run
  time: the base image's tag must ship the vLLM that the pinned vllm-omni expects), or
- a package the base image pinned (torch, vLLM, ...: the file written before `pip install`)
  now has another version: pip replaced what the image ships.

Reads installed metadata only (no import of torch or vLLM: no GPU at build time).

    python3 scripts/check_vllm_image.py /opt/rtvideo/image-pins.txt
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version


def problems(pins: list[str], installed: Callable[[str], str] = version) -> list[str]:
    """What is wrong with this image (empty: nothing); `pins` are `name==version` lines."""

    def have(name: str) -> str | None:
        try:
            return installed(name)
        except PackageNotFoundError:
            return None

    found = []
    for line in pins:
        name, _, pinned = line.partition("==")
        now = have(name)
        if now != pinned:
            found.append(f"{name} {pinned} of the base image was replaced by {now or 'nothing'}")
    vllm, omni = have("vllm"), have("vllm-omni")
    if vllm is None or omni is None:
        found.append(
            f"vLLM {vllm or 'missing'}, vllm-omni {omni or 'missing'}: "
            "the base image must be a tritonserver:<yy.mm>-vllm-python-py3 tag"
        )
    elif vllm.split(".")[:2] != omni.split(".")[:2]:
        want = ".".join(omni.split(".")[:2])
        found.append(
            f"vLLM {vllm} with vllm-omni {omni}: use a base image whose vLLM is {want}.x "
            "(Triton's compatibility matrix lists the vLLM of each -vllm-python-py3 tag)"
        )
    return found


def main(pins_file: str) -> int:
    with open(pins_file) as f:
        found = problems(f.read().split())
    for problem in found:
        print(f"check_vllm_image: {problem}", file=sys.stderr)
    if not found:
        print(
            f"check_vllm_image: vLLM {version('vllm')}, vllm-omni {version('vllm-omni')}, base image packages unchanged"
        )
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
