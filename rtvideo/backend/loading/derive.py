"""`python -m rtvideo.backend.loading.derive OUT [--name NAME] [KEY=VALUE ...]`: a model repository
derived from the shipped one (`rtvideo.triton.model_repo.derive_model`), its parameters checked
as the model checks them at load (`BackendSettings`), so that a bad value fails the image's
build, not its first start. The GPU image configures its model this way (Dockerfile)."""

from __future__ import annotations

import argparse
from pathlib import Path

from rtvideo.backend.loading.settings import BackendSettings
from rtvideo.triton.model_repo import MODEL_DIR, derive_model, read_parameters


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rtvideo.backend.loading.derive", description=__doc__)
    parser.add_argument("out", type=Path, help="model repository to write (created)")
    parser.add_argument("--name", default=MODEL_DIR.name, help="model name (default: %(default)s)")
    parser.add_argument("params", nargs="*", metavar="KEY=VALUE", help="parameters to override")
    args = parser.parse_intermixed_args(argv)  # OUT --name NAME KEY=VALUE, as the usage line has it
    params = dict(item.split("=", 1) for item in args.params)
    try:
        BackendSettings.from_parameters({**read_parameters(), **params})
        print(derive_model(args.out, args.name, params))
    except (ValueError, KeyError) as exc:
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
