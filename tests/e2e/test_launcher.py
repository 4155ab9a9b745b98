"""The launcher against a real tritonserver: a throwaway decoupled echo model with the
same sequence-batching setup as model_repository/realtime_video/config.pbtxt."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import textwrap
import time
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from rtvideo.triton.command import TritonConfig
from rtvideo.triton.install import find_tritonserver
from rtvideo.triton.server import TritonServer, free_port
from tests.support.paths import REPO_ROOT

REPO_ROOT = REPO_ROOT
REAL_CONFIG = REPO_ROOT / "model_repository" / "realtime_video" / "config.pbtxt"

ECHO_MODEL = textwrap.dedent(
    """
    import json

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            for request in requests:
                def scalar(name):
                    return pb_utils.get_input_tensor_by_name(request, name).as_numpy().reshape(-1)[0]

                meta = {
                    "echo": scalar("REQUEST").decode("utf-8"),
                    "start": int(scalar("START")),
                    "end": int(scalar("END")),
                    "corrid": int(scalar("CORRID")),
                }
                response = pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("META", np.array([json.dumps(meta).encode("utf-8")], dtype=np.object_)),
                        pb_utils.Tensor("DATA", np.zeros(0, dtype=np.uint8)),
                    ]
                )
                request.get_response_sender().send(
                    response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
                )
            return None
    """
)


@pytest.fixture(autouse=True, scope="module")
def _private_cache(tmp_path_factory):
    """The wheel's backend directory is assembled under $XDG_CACHE_HOME: keep it out of $HOME."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))
        yield


def _make_repository(root: Path, name: str, model_source: str) -> Path:
    """A repository holding one model ``name``: the real config (renamed) and ``model_source``."""
    config = REAL_CONFIG.read_text()
    config, count = re.subn(r'^name:\s*"realtime_video"', f'name: "{name}"', config, flags=re.M)
    assert count == 1, 'config.pbtxt must declare name: "realtime_video"'
    version_dir = root / name / "1"
    version_dir.mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(config)
    (version_dir / "model.py").write_text(model_source)
    return root


def _config(repo: Path) -> TritonConfig:
    return TritonConfig(model_repository=repo, grpc_port=free_port(), http_port=free_port(), metrics_port=free_port())


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _is_live(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return False
    return stat[stat.rfind(")") + 2 :].split()[0] not in ("Z", "X")


def test_echo_over_sequence_stream_and_clean_stop(tmp_path):
    repo = _make_repository(tmp_path / "repo", "echo_seq", ECHO_MODEL)
    log = tmp_path / "tritonserver.log"
    server = TritonServer(_config(repo), stdout=log)
    t0 = time.monotonic()
    server.start(timeout=90)
    try:
        print(f"tritonserver ready in {time.monotonic() - t0:.2f} s: {' '.join(server.command)}")
        assert server.is_alive()
        pids = server.process_pids()
        assert server.pid in pids
        stubs = [p for p in pids if "triton_python_backend_stub" in _cmdline(p)]
        assert stubs, f"expected a Python-backend stub in the server's process group, got {pids}"

        results: queue.Queue = queue.Queue()

        def callback(q, result, error):
            q.put((result, error))

        client = grpcclient.InferenceServerClient(url=server.grpc_url)
        try:
            assert client.is_model_ready("echo_seq")
            client.start_stream(callback=partial(callback, results))
            messages = ['{"type":"session.start","prompt":"a red fox"}', '{"type":"session.stop"}']
            sequence_id = 4242
            for i, message in enumerate(messages):
                request = grpcclient.InferInput("REQUEST", [1], "BYTES")
                request.set_data_from_numpy(np.array([message.encode("utf-8")], dtype=np.object_))
                client.async_stream_infer(
                    "echo_seq",
                    [request],
                    request_id=f"r{i}",
                    sequence_id=sequence_id,
                    sequence_start=(i == 0),
                    sequence_end=(i == len(messages) - 1),
                    outputs=[grpcclient.InferRequestedOutput("META"), grpcclient.InferRequestedOutput("DATA")],
                )
            got = {}
            for _ in messages:
                result, error = results.get(timeout=20)
                assert error is None, error
                meta = json.loads(result.as_numpy("META").reshape(-1)[0])
                assert result.as_numpy("DATA").size == 0
                got[result.get_response().id] = meta
            client.stop_stream()
        finally:
            client.close()

        assert got == {
            "r0": {"echo": messages[0], "start": 1, "end": 0, "corrid": sequence_id},
            "r1": {"echo": messages[1], "start": 0, "end": 1, "corrid": sequence_id},
        }
    finally:
        server.stop()

    assert not server.is_alive()
    assert server.process_pids() == []
    leftovers = [p for p in [server.pid, *pids] if _is_live(p)]
    assert leftovers == [], f"processes left behind: {[(p, _cmdline(p)) for p in leftovers]}"
    assert "echo_seq" in log.read_text()


def test_start_reports_a_model_that_fails_to_load(tmp_path):
    broken = ECHO_MODEL.replace(
        "class TritonPythonModel:",
        "class TritonPythonModel:\n    def initialize(self, args):\n        raise RuntimeError('boom-from-initialize')\n",
    )
    repo = _make_repository(tmp_path / "repo", "broken_seq", broken)
    server = TritonServer(_config(repo), stdout=tmp_path / "tritonserver.log")
    with pytest.raises(RuntimeError, match="boom-from-initialize"):
        server.start(timeout=90)
    assert not server.is_alive()
    assert server.process_pids() == []


def test_stop_kills_stubs_orphaned_by_a_dead_server(tmp_path):
    repo = _make_repository(tmp_path / "repo", "echo_seq", ECHO_MODEL)
    server = TritonServer(_config(repo), stdout=tmp_path / "tritonserver.log")
    server.start(timeout=90)
    try:
        stubs = [p for p in server.process_pids() if "triton_python_backend_stub" in _cmdline(p)]
        assert stubs
        os.kill(server.pid, signal.SIGKILL)  # a crash: the stub is orphaned, still in the group
        deadline = time.monotonic() + 10
        while server.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not server.is_alive()
    finally:
        server.stop()
    assert server.process_pids() == []
    assert [p for p in stubs if _is_live(p)] == []


def test_find_tritonserver_rejects_missing_env_path(tmp_path, monkeypatch):
    missing = tmp_path / "no" / "tritonserver"
    monkeypatch.setenv("TRITONSERVER", str(missing))
    with pytest.raises(FileNotFoundError, match=r"TRITONSERVER=.*no/tritonserver"):
        find_tritonserver()


def test_find_tritonserver_default_prepares_python_stub():
    install = find_tritonserver()
    assert install.binary.is_file() and os.access(install.binary, os.X_OK)
    if install.kind == "wheel":
        stub = install.backend_directory / "python" / "triton_python_backend_stub"
        assert stub.is_file() and os.access(stub, os.X_OK)
        version = f"{os.sys.version_info.major}.{os.sys.version_info.minor}"
        assert stub.resolve().parent.name == version
        assert (install.backend_directory / "python" / "triton_python_backend_utils.py").is_file()


def test_the_temp_cache_must_be_this_users_own(tmp_path, monkeypatch):
    """tritonserver loads backends from the cache: with ~/.cache unusable, the shared temp dir's
    `rtvideo-<uid>` is used only when it is this user's own directory that only it may write."""
    from rtvideo.triton import install

    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker / "cache"))  # mkdir fails under a file
    shared = tmp_path / "tmp"
    shared.mkdir()
    monkeypatch.setattr(install.tempfile, "gettempdir", lambda: str(shared))
    root = shared / f"rtvideo-{os.getuid()}"

    assert install.cache_root() == root and root.is_dir()
    assert root.stat().st_mode & 0o777 == 0o700
    root.chmod(0o777)  # others may write: they could plant backends
    with pytest.raises(RuntimeError, match="only it may write"):
        install.cache_root()
    root.rmdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    root.symlink_to(elsewhere)  # a link (to anywhere) made in the shared dir
    with pytest.raises(RuntimeError, match="only it may write"):
        install.cache_root()
    root.unlink()
    if os.getuid() == 0:  # another user's directory
        root.mkdir(mode=0o755)
        os.chown(root, 12345, 12345)
        with pytest.raises(RuntimeError, match="owner uid 12345"):
            install.cache_root()


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="POSIX shared memory in /dev/shm")
def test_stale_shared_memory_is_judged_only_within_its_pid_namespace():
    """A launcher gone (a pid that no longer runs) leaves files that the next start removes; a
    file named for another PID namespace (a container sharing /dev/shm) is left alone: its pid
    says nothing here. Names without a namespace (an earlier version's) count as this one's."""
    import subprocess

    from rtvideo.triton.shm_files import SHM_DIR, clean_stale_shm, pid_namespace, shm_prefix_of

    gone = subprocess.Popen(["true"])
    gone.wait()  # its pid runs nothing now
    namespace = pid_namespace()
    assert namespace, "no PID namespace could be read"
    other = format(int(namespace, 16) + 1, "x")
    names = {
        "here": f"{shm_prefix_of(gone.pid)}deadbeef_region",
        "older": f"rtvideo_{gone.pid}_deadbeef_region",
        "elsewhere": f"rtvideo_n{other}_{gone.pid}_deadbeef_region",
        "alive": f"{shm_prefix_of(os.getpid())}deadbeef_region",
    }
    try:
        for name in names.values():
            (SHM_DIR / name).write_bytes(b"x")
        removed = set(clean_stale_shm())
        assert {names["here"], names["older"]} <= removed
        assert names["elsewhere"] not in removed and (SHM_DIR / names["elsewhere"]).exists()
        assert names["alive"] not in removed and (SHM_DIR / names["alive"]).exists()
    finally:
        for name in names.values():
            (SHM_DIR / name).unlink(missing_ok=True)
