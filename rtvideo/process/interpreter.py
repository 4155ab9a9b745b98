"""The Python interpreter for processes the model starts, whatever process hosts the model.

Inside Triton's Python-backend stub `sys.executable` may be the stub binary (or empty) and
`sys.argv` is `[""]`; a `multiprocessing` spawn child or a launched worker needs a real
interpreter with the model's environment (the venv, or a packed `EXECUTION_ENV`, whose prefix
the stub puts in `sys.prefix`). And the stub never sets the process locale, as the `python`
command does (PEP 538), so its default text encoding is ASCII whatever `LANG` says
(`PYTHONUTF8` is not read either): `utf8_text` is the remedy.
"""

from __future__ import annotations

import codecs
import io
import locale
import multiprocessing
import os
import shutil
import sys
from pathlib import Path

#: names the interpreter explicitly (a deployment whose stub hides every other way to find it)
ENV = "RTVIDEO_WORKER_PYTHON"
#: what `sys.argv[0]` becomes when the host left it empty (libraries log and parse it)
PROGRAM = "rtvideo-model"


def _is_python(path: str) -> bool:
    return bool(path) and os.path.basename(path).startswith("python") and os.access(path, os.X_OK)


def worker_python() -> str:
    """`$RTVIDEO_WORKER_PYTHON`, else this process's interpreter when it is a Python, else the
    environment's own (`sys.prefix/bin/python3`), else `python3` on PATH."""
    explicit = os.environ.get(ENV)
    if explicit:
        return explicit
    if _is_python(sys.executable):
        return sys.executable
    prefixed = str(Path(sys.prefix) / "bin" / "python3")
    if _is_python(prefixed):
        return prefixed
    found = shutil.which("python3")
    if found is None:
        raise RuntimeError(f"no Python interpreter for the model's worker processes: set {ENV}")
    return found


def prepare_spawn() -> str:
    """Make every `multiprocessing` child (an engine's workers included) start as a real
    interpreter of this environment: the spawn executable set explicitly, vLLM told to spawn
    (forking a process that runs Triton's stub threads is unsafe) unless the deployer chose,
    and a program name where the host left `sys.argv[0]` empty. Returns the interpreter."""
    python = worker_python()
    multiprocessing.set_executable(python)
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    if not sys.argv or not sys.argv[0]:
        sys.argv[:1] = [PROGRAM]
    return python


#: tried in order when the process's text encoding is not UTF-8: the environment's locale, then
#: the one every glibc since 2.35 (and musl) has built in
UTF8_LOCALES = ("", "C.UTF-8", "en_US.UTF-8")


def utf8_text() -> str:
    """Make `open()` without an encoding read UTF-8 in this process, as under the `python`
    command: set LC_CTYPE to a UTF-8 locale when it is not one. Libraries read their UTF-8 data
    files that way (torch's inductor templates, imported with vLLM); stdout and stderr written in
    ASCII are switched to UTF-8 too (vLLM logs non-ASCII text). Returns the encoding."""
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper) and codecs.lookup(stream.encoding).name == "ascii":
            stream.reconfigure(encoding="utf-8", errors="backslashreplace")
    if codecs.lookup(locale.getencoding()).name == "utf-8":
        return "utf-8"
    for name in UTF8_LOCALES:
        try:
            locale.setlocale(locale.LC_CTYPE, name)
        except locale.Error:
            continue
        if codecs.lookup(locale.getencoding()).name == "utf-8":
            return "utf-8"
    return codecs.lookup(locale.getencoding()).name
