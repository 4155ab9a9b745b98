"""Installed like a user would: a wheel in fresh virtual environments outside the checkout, the
container recipe linted, and `rtvideo serve` refusing bad settings with one clear line."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import venv
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from websockets.asyncio.client import connect

from tests.support.paths import REPO_ROOT
from tests.support.processes import RTVIDEO
from tests.support.proxy_client import http_status
from tests.support.proxy_host import run
from tests.support.serve_session import serve_one_session

ROOT = REPO_ROOT


def pip(python: Path, *args: str, cwd: Path) -> None:
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-compile", *args],
        cwd=cwd,
        check=True,
        timeout=900,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )


def fresh_venv(path: Path) -> Path:
    venv.EnvBuilder(with_pip=True).create(path)
    return path / "bin" / "python"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The project's wheel, built from this checkout (not editable)."""
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), str(ROOT)],
        check=True,
        timeout=600,
        cwd=out,
    )
    (found,) = out.glob("rtvideo-*.whl")
    yield found


def test_wheel_carries_the_browser_demo_and_its_module(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {
        "rtvideo/proxy/static/index.html",
        "rtvideo/proxy/static/rtvideo.js",
        "rtvideo/proxy/static/rtvideo.css",  # the styles index.html and recordings.html share
        "rtvideo/proxy/static/recordings.html",
    } <= names


@pytest.mark.slow  # a fresh virtual environment and a pip install
def test_client_only_install_needs_neither_torch_nor_tornado(wheel: Path, tmp_path: Path) -> None:
    python = fresh_venv(tmp_path / "venv")
    pip(python, str(wheel), cwd=tmp_path)
    check = (
        "import sys, rtvideo.client.session, rtvideo.core.protocol; "
        "heavy = {'torch', 'tornado', 'tritonclient', 'numpy', 'av'} & set(sys.modules); "
        "assert not heavy, heavy; print('ok')"
    )
    out = subprocess.run([str(python), "-c", check], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "ok", out.stderr
    freeze = subprocess.run([str(python), "-m", "pip", "freeze"], capture_output=True, text=True, check=True).stdout
    assert not re.search(r"^(torch|tornado|av|tritonclient)==", freeze, re.M | re.I), freeze
    schemas = (
        "import json; from importlib.resources import files; "
        "print(sorted(json.loads((files('rtvideo') / 'schemas' / f'{n}_messages.json').read_text())['$defs'] "
        "and n for n in ('client', 'server')))"
    )
    out = subprocess.run([str(python), "-c", schemas], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "['client', 'server']", out.stderr  # the schemas ship as package data
    record = subprocess.run(
        [str(python.parent / "rtvideo"), "record", "x", "--url", "ws://127.0.0.1:9"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert record.returncode == 1 and "pip install av" in record.stderr, record.stderr  # no PyAV here: says how


@pytest.mark.triton  # `rtvideo serve` starts a tritonserver
@pytest.mark.slow  # and installs torch and the server extra into a fresh virtual environment first
def test_wheel_with_server_extra_serves_from_another_directory(wheel: Path, tmp_path: Path) -> None:
    """Non-editable [server] install: the model repository comes from the package data."""
    python = fresh_venv(tmp_path / "venv")
    import torch  # the same build as the checkout's (on these machines a local CPU wheel: no download)

    pip(python, f"torch=={torch.__version__.split('+')[0]}", f"{wheel}[server]", cwd=tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    repo = subprocess.run(
        [str(python), "-c", "from rtvideo.triton.model_repo import MODEL_REPOSITORY as r; print(r)"],
        cwd=elsewhere,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert repo.startswith(str(tmp_path / "venv")), repo  # inside the installed package, not the checkout
    serve_one_session(python.parent / "rtvideo", tmp_path, cwd=elsewhere)


def test_dockerfile_lints_and_copies_what_exists() -> None:
    dockerfile = ROOT / "Dockerfile"
    lint = subprocess.run(
        [str(Path(sys.executable).parent / "hadolint"), str(dockerfile)], capture_output=True, text=True, timeout=120
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr
    copies = re.findall(r"^COPY\s+(?!--from)(.+?)\s+\S+$", dockerfile.read_text(), re.M)
    assert copies, "no COPY in the Dockerfile"
    for line in copies:
        for source in line.split():
            if not source.startswith("--"):
                assert (ROOT / source).exists(), f"the Dockerfile copies {source}, which does not exist"


def test_container_health_check_is_not_readiness(proxies) -> None:
    """The image's HEALTHCHECK polled /readyz, which is 503 whenever every connection is in use:
    a full server turned 'unhealthy' after 30 s, and an orchestrator replacing unhealthy
    containers would end every live session. It polls /healthz, which a full server passes, on
    the health listener (RTVIDEO_HEALTH_PORT), which idle connections to the main port cannot starve."""
    text = (ROOT / "Dockerfile").read_text()
    match = re.search(r"^HEALTHCHECK .*?CMD (.+?)$", text, re.M | re.S)
    url = re.search(r"http://127\.0\.0\.1:(\d+)(/\w*)", match.group(1)) if match else None
    assert url, "no HEALTHCHECK with a URL"
    health_port, path = url.groups()
    assert f"RTVIDEO_HEALTH_PORT={health_port}" in text, "the HEALTHCHECK polls another port than the health listener's"
    server = proxies.server(max_connections=1, health_port=0)

    async def full() -> tuple[int, int]:
        async with connect(server.url):
            await asyncio.sleep(0.2)
            checked = await asyncio.to_thread(http_status, server.health_port, path, "127.0.0.1")
            return checked, await asyncio.to_thread(http_status, server.health_port, "/readyz", "127.0.0.1")

    checked, ready = run(full())
    assert ready == 503 and checked == 200, (path, checked)


@pytest.mark.parametrize(
    "args,env,fragment",
    [
        (["--fps", "abc"], {}, "fps='abc' is not a valid value"),
        (["--width", "255"], {}, "width 255 is not supported"),
        (["--max-connections", "0"], {}, "must be positive"),
        ([], {"RTVIDEO_MAX_SESSIONS": "many"}, "RTVIDEO_MAX_SESSIONS"),
        ([], {"RTVIDEO_PORT": "http"}, "RTVIDEO_PORT"),
        (["--triton-host", "0.0.0.0 8001"], {}, "--triton-host"),
        (["--triton-host", "0.0.0.0"], {"RTVIDEO_TRITON_KEY": ""}, "with no access key"),  # Triton published, open
        (["--triton-host", "10.1.2.3"], {"RTVIDEO_TRITON_KEY": ""}, "--triton-key or RTVIDEO_TRITON_KEY"),
        (["--triton-key", "two words"], {}, "--triton-key"),
        (["--log-level", "loud"], {}, "--log-level"),
        ([], {"RTVIDEO_LOG_LEVEL": "verbose"}, "RTVIDEO_LOG_LEVEL"),
        ([], {"RTVIDEO_LOG_FORMAT": "xml"}, "RTVIDEO_LOG_FORMAT"),
        (["--port", "80800"], {}, "port"),  # served on 80800 - 65536 = 15264 before
        (["--triton-grpc-port", "70001"], {}, "--triton-grpc-port"),
        (["--probe-interval", "nan"], {}, "probe_interval='nan'"),  # probed in a busy loop before
        ([], {"RTVIDEO_START_TIMEOUT": "inf"}, "RTVIDEO_START_TIMEOUT"),
        (["--max-session-seconds", "NaN"], {}, "max_session_seconds='NaN'"),  # sessions without end
        (["--device", 'cuda:0" } }'], {}, "device"),  # went into the derived config.pbtxt as written
        (["--max-sessions", "64"], {}, "max_candidate_sequences"),  # the probe waited in Triton's backlog
    ],
)
def test_bad_values_give_one_line_and_exit_2(args: list[str], env: dict[str, str], fragment: str) -> None:
    out = subprocess.run(
        [str(RTVIDEO), "serve", *args], capture_output=True, text=True, timeout=60, env={**os.environ, **env}
    )
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0] and "Traceback" not in out.stderr, out.stderr


def test_dockerfile_targets_and_the_pinned_vllm_omni() -> None:
    """Both images keep the serving properties; every place pins the same vllm-omni, and the
    wheel's version check wants the vLLM major.minor the comment and the check script speak of."""
    from rtvideo.backend.vllm_omni.engine import PINNED_VLLM_OMNI
    from tests.support.vllm_omni_wheel import wheel_source

    text = (ROOT / "Dockerfile").read_text()
    stages = re.split(r"^FROM ", text, flags=re.M)[1:]
    assert [s.split()[2] for s in stages] == ["source", "cpu", "vllm-omni"]  # the last one is the default target
    stages = stages[1:]  # "source" only holds the project's files, copied into both images
    for stage in stages:
        assert "useradd --create-home --uid 10001" in stage and "USER 10001" in stage
        assert "8081/healthz'" in stage  # full is not unhealthy
        # Triton's ports are not published and Triton stays on loopback (its own key, docs/security.md).
        (expose,) = re.findall(r"^EXPOSE (.*)$", stage, re.M)
        assert "8080" in expose.split() and not {"8001", "8002"} & set(expose.split())
        (cmd,) = re.findall(r"^CMD (\[.*?\])$", stage, re.M | re.S)
        assert '"--triton-log", "-"' in cmd and "--triton-host" not in cmd
        assert "RTVIDEO_HEALTH_PORT=8081" in stage  # on the health listener
        assert 'ENTRYPOINT ["rtvideo", "serve"]' in stage
    gpu = stages[1]
    assert f"ARG VLLM_OMNI_VERSION={PINNED_VLLM_OMNI}" in gpu and "generator=vllm_omni" in gpu
    # Everything but rtvideo from the hash-checked lock (tests/deploy/test_vllm_lock.py checks it).
    assert "ARG VLLM_OMNI_LOCK=deploy/gpu/requirements.lock" in gpu and '-r "${VLLM_OMNI_LOCK}"' in gpu
    assert "--no-deps ." in gpu
    # One base for both images, a Triton without the shared-memory CVEs (CVE-2025-23319/23320/23334): 25.07 on.
    tags = re.findall(r"^ARG \w*TRITON_IMAGE=nvcr\.io/nvidia/tritonserver:(\d\d)\.(\d\d)-", text, re.M)
    assert len(tags) == 1 and all((int(y), int(m)) >= (25, 7) for y, m in tags), tags
    assert [s.split()[0] for s in stages] == ["${TRITON_IMAGE}", "${TRITON_IMAGE}"]
    assert f"VLLM_OMNI_VERSION={PINNED_VLLM_OMNI}" in (ROOT / "scripts" / "setup.sh").read_text()
    assert f"__version__ = version = '{PINNED_VLLM_OMNI}'" in wheel_source("vllm_omni/_version.py")
    assert "omni_ver != vllm_ver" in wheel_source("vllm_omni/version.py")  # major.minor must match vLLM's


def test_every_image_that_runs_the_proxy_carries_the_session_stores_client() -> None:
    """`--session-store redis://…` imports the Redis client when the proxy starts; it is only in
    the optional `redis` extra, so an image that installs rtvideo without it fails there with an
    ImportError. The cpu image installs rtvideo with its extras; the vllm-omni image installs
    rtvideo without dependencies and everything else from its hash-checked lock."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    client = [Requirement(r) for r in extras["redis"]]
    assert [r.name for r in client] == ["redis"]
    text = (ROOT / "Dockerfile").read_text()
    stages = {s.split()[2]: s for s in re.split(r"^FROM ", text, flags=re.M)[1:]}
    serving = {name: stage for name, stage in stages.items() if 'ENTRYPOINT ["rtvideo", "serve"]' in stage}
    assert sorted(serving) == ["cpu", "vllm-omni"]
    for name, stage in serving.items():
        stage = stage.replace("\\\n", " ")  # one line per RUN
        with_extras = re.search(r"pip install [^\n]*\"\.\[([\w,-]+)\]\"", stage)
        lock = re.search(r"--no-deps [^\n]*-r \"?(\$\{\w+\}|\S+\.lock)\"?", stage)
        assert bool(with_extras) != bool(lock), f"{name}: rtvideo goes in either with its extras or beside a lock"
        if with_extras:
            assert "redis" in with_extras.group(1).split(","), f"{name} installs .[{with_extras.group(1)}]"
            continue
        assert lock and re.search(r"pip install [^\n]*--no-deps \.(\s|$)", stage), name
        locks = [lock.group(1)]
        if locks[0].startswith("${"):  # a build argument: its default, and every lock the stage copies
            (default,) = re.findall(rf"^ARG {locks[0][2:-1]}=(\S+)$", stage, re.M)
            locks = sorted({default, *re.findall(r"^COPY (?:\S+ )*?(deploy/gpu/\S*requirements\.lock) ", stage, re.M)})
        for path in locks:
            pins = {
                canonicalize_name(m.group(1)): m.group(2)
                for m in re.finditer(r"^([A-Za-z0-9][\w.-]*)(?:\[[^\]]*\])?==(\S+)", (ROOT / path).read_text(), re.M)
            }
            for requirement in client:
                pinned = pins.get(canonicalize_name(requirement.name))
                assert pinned is not None and requirement.specifier.contains(pinned), (name, path, requirement, pinned)
