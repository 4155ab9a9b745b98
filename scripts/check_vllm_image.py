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
from importlib.metadata import PackageNotFoundError, version


def main(pins_file: str) -> int:
    problems = []
    for line in open(pins_file).read().split():
        name, _, pinned = line.partition("==")
        try:
            now = version(name)
        except PackageNotFoundError:
            now = "(removed)"
        if now != pinned:
            problems.append(f"{name} {pinned} of the base image was replaced by {now}")
    vllm, omni = version("vllm"), version("vllm-omni")
    if vllm.split(".")[:2] != omni.split(".")[:2]:
        want = ".".join(omni.split(".")[:2])
        problems.append(f"vLLM {vllm} with vllm-omni {omni}: use a base image whose vLLM is {want}.x "
                        "(Triton's compatibility matrix lists the vLLM of each -vllm-python-py3 tag)")
    for problem in problems:
        print(f"check_vllm_image: {problem}", file=sys.stderr)
    if not problems:
        print(f"check_vllm_image: vLLM {vllm}, vllm-omni {omni}, base image packages unchanged")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
