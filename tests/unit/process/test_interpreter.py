"""Processes the model starts run a real interpreter of its environment even inside Triton's
stub, where `sys.executable` may be the stub binary and `sys.argv` is `[""]`: a `multiprocessing`
spawn child (how vLLM-Omni starts its engine's workers) is imitated here in a process whose
`sys.executable` is not a Python at all."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from rtvideo.process import interpreter
from tests.support.paths import REPO_ROOT

STUB = textwrap.dedent(
    """
    import json, multiprocessing, os, sys
    sys.executable, sys.argv = {stub!r}, [""]  # what Triton's stub shows a model
    if {prepare}:
        from rtvideo.process.interpreter import prepare_spawn
        prepare_spawn()
    from tests.unit.process.test_interpreter import child_report
    ctx = multiprocessing.get_context(os.environ.get("VLLM_WORKER_MULTIPROC_METHOD", "spawn"))
    queue = ctx.Queue()
    child = ctx.Process(target=child_report, args=(queue,))
    child.start()
    print(json.dumps(queue.get(timeout={wait})))
    child.join(60)
    """
)


def child_report(queue) -> None:  # type: ignore[no-untyped-def]
    """In the spawned child: which interpreter runs it, with which environment."""
    queue.put({"executable": sys.executable, "prefix": sys.prefix, "marker": os.environ.get("RTVIDEO_TEST_MARKER")})


def run_stub(tmp_path: Path, prepare: bool) -> subprocess.CompletedProcess[str]:
    stub = tmp_path / "triton_python_backend_stub"
    stub.write_text("#!/bin/sh\nexit 3\n")  # not a Python: a spawn with it as the executable fails
    stub.chmod(0o755)
    env = {
        **{k: v for k, v in os.environ.items() if k not in (interpreter.ENV, "VLLM_WORKER_MULTIPROC_METHOD")},
        "RTVIDEO_TEST_MARKER": "model-env",
        "PYTHONPATH": str(REPO_ROOT),
    }
    return subprocess.run(
        [sys.executable, "-c", STUB.format(stub=str(stub), prepare=prepare, wait=60 if prepare else 5)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=REPO_ROOT,
    )


def test_a_spawn_child_of_the_stub_runs_this_environments_python(tmp_path: Path) -> None:
    out = run_stub(tmp_path, prepare=True)
    assert out.returncode == 0, out.stderr
    import json

    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["prefix"] == sys.prefix and os.path.basename(report["executable"]).startswith("python")
    assert report["marker"] == "model-env"  # the model's environment reaches the worker


def test_without_it_the_spawn_child_never_starts(tmp_path: Path) -> None:
    out = run_stub(tmp_path, prepare=False)
    assert out.returncode != 0  # the child is exec'd as the stub binary


def test_the_interpreter_is_found_without_a_python_sys_executable(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv(interpreter.ENV, raising=False)
    monkeypatch.setattr(sys, "executable", "/opt/tritonserver/backends/python/triton_python_backend_stub")
    assert interpreter.worker_python() == str(Path(sys.prefix) / "bin" / "python3")
    monkeypatch.setenv(interpreter.ENV, "/usr/bin/python3.12")
    assert interpreter.worker_python() == "/usr/bin/python3.12"


UTF8_READ = textwrap.dedent(
    """
    import locale, sys
    locale.setlocale(locale.LC_CTYPE, "C")  # the stub's state: the locale never set, ASCII text
    def read():
        try:
            return open(sys.argv[1]).read()
        except UnicodeDecodeError:
            return "refused"
    before = read()
    from rtvideo.process.interpreter import utf8_text
    print(before, utf8_text(), read())
    """
)


def test_utf8_text_lets_open_read_utf8_where_the_locale_was_never_set(tmp_path: Path) -> None:
    """torch's inductor templates (imported with vLLM) are UTF-8 read by `open()` with no encoding:
    in the stub that read failed until the locale was set."""
    data = tmp_path / "template.py.jinja"
    data.write_text("# a template — with a dash\n", encoding="utf-8")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("LC_", "PYTHONUTF8"))},
        "PYTHONPATH": str(REPO_ROOT),
    }
    done = subprocess.run(
        [sys.executable, "-X", "utf8=0", "-c", UTF8_READ, str(data)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=REPO_ROOT,
        check=True,
    )
    assert done.stdout.split(" ", 2)[:2] == ["refused", "utf-8"], done.stdout
    assert done.stdout.rstrip("\n").endswith("— with a dash"), done.stdout
