"""Triton's own gRPC port as an attacker on the network meets it (docs/security.md): without the
access key every protocol but health is refused before it reaches the model or Triton's core,
and Triton stays up; with the key an ordinary probe works. Against the session's tritonserver
(started with a key, as `rtvideo serve` starts its own), and `rtvideo serve` itself: the key it
generates is on its Triton and nowhere in its output.

Without the key (a tritonserver started without one) each of these calls goes through: the
string `sequence_id` kills tritonserver (`free(): invalid size`, SIGABRT), shared memory and
log settings change, the model config, statistics and repository index are read."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import queue
import signal
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from rtvideo.triton import wire
from rtvideo.triton.access import KEY_ENV, KEY_NAME, key_headers
from rtvideo.triton.server import free_port
from tests.support.processes import end_all
from tests.support.serve_session import launch
from tests.support.streams import FAST_MODEL

REFUSED = f"expecting header 'triton-grpc-protocol-{KEY_NAME}'"
MiB = 1024 * 1024
#: the message sizes of a raw gRPC channel: tritonclient's (2 GiB), so that a large request is sent
CHANNEL_OPTIONS = [("grpc.max_send_message_length", 2**31 - 1), ("grpc.max_receive_message_length", 2**31 - 1)]


def _keyed(triton: Any) -> Any:
    """The session's server, which must have a key: an attack below kills a server without one."""
    assert triton.config.key, "the triton fixture starts its server with a key"
    return triton


def _request(payload: bytes, sequence_id: int | str, *, start: bool = True, end: bool = True) -> Any:
    """One ModelInferRequest as an attacker builds it (any `sequence_id` type, any size)."""
    request = service_pb2.ModelInferRequest(model_name=FAST_MODEL, id="attack")
    if isinstance(sequence_id, str):
        request.parameters["sequence_id"].string_param = sequence_id
    else:
        request.parameters["sequence_id"].int64_param = sequence_id
    request.parameters["sequence_start"].bool_param = start
    request.parameters["sequence_end"].bool_param = end
    tensor = request.inputs.add()
    tensor.name, tensor.datatype = wire.REQUEST, "BYTES"
    tensor.shape.extend([1])
    request.raw_input_contents.append(struct.pack("<I", len(payload)) + payload)
    return request


def _stream(url: str, request: Any, metadata: dict[str, str] | None = None) -> str:
    """Send `request` on a ModelStreamInfer call of its own (the message goes out with the call);
    the first answer: an error message, the response's META, or the call's status."""
    with grpc.insecure_channel(url, options=CHANNEL_OPTIONS) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        try:
            for response in stub.ModelStreamInfer(iter([request]), metadata=list((metadata or {}).items()), timeout=60):
                return response.error_message or response.infer_response.raw_output_contents[0][4:].decode()
            return "ended"
        except grpc.RpcError as exc:
            return f"{exc.code().name}: {exc.details()}"


def _probe(triton: Any) -> str:
    """The supervisor's health probe with the key: session.ping alone on a fresh sequence; the
    type of its answer (a pong carries what the model says of itself besides)."""
    request = _request(b'{"type":"session.ping"}', int.from_bytes(os.urandom(7), "big") + 1)
    answer = _stream(triton.grpc_url, request, triton.client_headers())
    try:
        return str(json.loads(answer)["type"])
    except (ValueError, KeyError, TypeError):
        return answer  # an error's text


def _alive_a_second_later(triton: Any, pid: int) -> None:
    time.sleep(1.0)
    assert triton.is_alive() and triton.pid == pid, "tritonserver died"
    assert _probe(triton) == "session.pong"


def test_health_stays_open_and_a_keyed_probe_works(triton) -> None:
    triton = _keyed(triton)
    client = grpcclient.InferenceServerClient(triton.grpc_url)
    try:
        assert client.is_server_live() and client.is_server_ready() and client.is_model_ready(FAST_MODEL)
    finally:
        client.close()
    assert _probe(triton) == "session.pong"


def test_a_long_string_sequence_id_is_refused_and_triton_stays_up(triton) -> None:
    """A string `sequence_id` of 27+ characters overflows the 8-byte buffer of the uint64 CORRID
    control in Triton 2.51's core: `free(): invalid size`, SIGABRT, every session gone. Without
    the key it is refused at the door: by the sync client, and sent raw with the call."""
    triton = _keyed(triton)
    pid = triton.pid
    for end in (False, True):  # without the key one of them takes Triton down, the first often already
        attack = _request(b'{"type":"session.ping"}', ("x" if end else "w") * 40, end=end)
        assert _stream(triton.grpc_url, attack).endswith(REFUSED)
    replies: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(triton.grpc_url)
    try:
        client.start_stream(callback=lambda result, error: replies.put(error))
        tensor = grpcclient.InferInput(wire.REQUEST, [1], "BYTES")
        tensor.set_data_from_numpy(wire.request_array({"type": "session.ping"}))
        with contextlib.suppress(InferenceServerException):  # the refusal came first: the stream is broken already
            client.async_stream_infer(FAST_MODEL, [tensor], sequence_id="y" * 40, sequence_start=True)
        assert REFUSED in str(replies.get(timeout=10))
        client.stop_stream()
    finally:
        client.close()
    _alive_a_second_later(triton, pid)


def _backend_region(triton: Any) -> str:
    """The name of one of the Python backend's own shared-memory regions (what an oversized
    request's error named before, and what CVE-2025-23320's chain registers)."""
    names = sorted(n for n in os.listdir("/dev/shm") if n.startswith(triton.shm_prefix))
    assert names, f"no shared-memory region with prefix {triton.shm_prefix}"
    return names[0]


#: the protocol groups an attacker misuses, one call each: (what, call without the key)
UNKEYED_CALLS: list[tuple[str, Callable[[Any, Any], Any]]] = [
    (
        "shared-memory registration of the backend's region",
        lambda c, t: c.register_system_shared_memory("stolen", "/" + _backend_region(t), 4096),
    ),
    ("shared-memory status", lambda c, t: c.get_system_shared_memory_status()),
    ("log settings change", lambda c, t: c.update_log_settings({"log_info": False, "log_error": False})),
    ("log settings read", lambda c, t: c.get_log_settings()),
    ("model config read", lambda c, t: c.get_model_config(FAST_MODEL)),
    ("statistics", lambda c, t: c.get_inference_statistics()),
    ("model repository index", lambda c, t: c.get_model_repository_index()),
    ("model unload", lambda c, t: c.unload_model(FAST_MODEL)),
    ("server metadata", lambda c, t: c.get_server_metadata()),
    ("trace settings", lambda c, t: c.get_trace_settings()),
    ("unary inference", lambda c, t: c.infer(FAST_MODEL, [_ping_input()], sequence_id=7, sequence_start=True)),
]


def _ping_input() -> Any:
    tensor = grpcclient.InferInput(wire.REQUEST, [1], "BYTES")
    tensor.set_data_from_numpy(wire.request_array({"type": "session.ping"}))
    return tensor


@pytest.mark.parametrize("call", [c for _, c in UNKEYED_CALLS], ids=[what for what, _ in UNKEYED_CALLS])
def test_without_the_key_every_other_protocol_is_refused(triton, call: Callable[[Any, Any], Any]) -> None:
    triton = _keyed(triton)
    pid = triton.pid
    client = grpcclient.InferenceServerClient(triton.grpc_url)
    try:
        with pytest.raises(InferenceServerException, match="This protocol is restricted"):
            call(client, triton)
    finally:
        client.close()
    keyed = grpcclient.InferenceServerClient(triton.grpc_url)
    try:  # nothing changed: no region registered, logging on, the model loaded
        headers = triton.client_headers()
        assert not keyed.get_system_shared_memory_status(headers=headers).regions
        settings = keyed.get_log_settings(headers=headers).settings
        assert settings["log_error"].bool_param and settings["log_info"].bool_param
        assert keyed.is_model_ready(FAST_MODEL)
        assert keyed.get_model_config(FAST_MODEL, headers=headers).config.name == FAST_MODEL  # the key opens it
    finally:
        keyed.close()
    _alive_a_second_later(triton, pid)


# --- memory after large refused requests ---------------------------------------------------------
def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


def _shm_bytes(prefix: str) -> int:
    """Bytes the Python backend's shared-memory regions of one server hold (allocated blocks)."""
    return sum(os.stat(f"/dev/shm/{n}").st_blocks * 512 for n in os.listdir("/dev/shm") if n.startswith(prefix))


@pytest.mark.slow
def test_memory_returns_after_large_requests_without_the_key(tmp_path: Path) -> None:
    """Three 300 MiB ModelInfer requests in parallel without the key: gRPC reads each whole before
    the restriction refuses it (tritonserver's RSS peaks at about 1 GiB). Afterwards its RSS is
    back within 50 MB of the baseline taken here (it kept 1.5 GB with Triton's default
    `--grpc-infer-allocation-pool-size` of 8, and 300-700 MB with 0 alone: the slices gRPC read
    the requests into stayed in malloc's heaps until `TritonConfig.malloc_mmap_threshold`), the
    Python backend's shared memory has not grown (nothing reached the model), and Triton answers
    a keyed probe."""
    from rtvideo.triton.access import generate_key
    from rtvideo.triton.command import TritonConfig
    from rtvideo.triton.model_repo import derive_model
    from rtvideo.triton.server import TritonServer

    repo = tmp_path / "repo"
    derive_model(repo, FAST_MODEL, {"pacing_lead_chunks": "off", "render_workers": "0"})
    server = TritonServer(
        TritonConfig(repo, grpc_port=free_port(), metrics_port=free_port(), key=generate_key()),
        stdout=tmp_path / "triton.log",
    )
    server.start(timeout=300)
    try:
        for _ in range(3):
            assert _probe(server) == "session.pong"
        time.sleep(1.0)
        baseline, shm_before = _rss_mb(server.pid), _shm_bytes(server.shm_prefix)
        payload = b'{"type":"session.start","prompt":"' + b"x" * (300 * MiB) + b'"}'
        requests = [_request(payload, 1000 + i) for i in range(3)]
        del payload
        answers: list[str] = []

        def attack(request: Any) -> None:
            with grpc.insecure_channel(server.grpc_url, options=CHANNEL_OPTIONS) as channel:
                try:
                    service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=120)
                    answers.append("answered")
                except grpc.RpcError as exc:
                    answers.append(f"{exc.code().name}: {exc.details()}")

        threads = [threading.Thread(target=attack, args=(r,)) for r in requests]
        peak = baseline
        for thread in threads:
            thread.start()
        while any(t.is_alive() for t in threads):
            peak = max(peak, _rss_mb(server.pid))
            time.sleep(0.05)
        del requests, threads
        assert len(answers) == 3 and all(a.endswith(REFUSED) for a in answers), answers
        deadline = time.monotonic() + 15
        while (after := _rss_mb(server.pid)) > baseline + 50 and time.monotonic() < deadline:
            time.sleep(0.5)
        print(f"tritonserver RSS: {baseline:.0f} MB before, {peak:.0f} MB at the peak, {after:.0f} MB after")
        assert after <= baseline + 50, f"tritonserver kept {after - baseline:.0f} MB (peak {peak:.0f} MB)"
        assert _shm_bytes(server.shm_prefix) <= shm_before, "the Python backend's shared memory grew"
        assert server.is_alive() and _probe(server) == "session.pong"
    finally:
        server.stop()


# --- rtvideo serve: a key of its own ---------------------------------------------------------------
def test_serve_generates_a_key_for_its_triton_and_shows_it_nowhere(tmp_path: Path) -> None:
    """`rtvideo serve` on loopback with no key given: its Triton gets a fresh one (on its command
    line), the proxy uses it (a session streams), an unkeyed call is refused, and the key is in
    neither the serve output nor Triton's log."""
    from rtvideo.client.session import RealtimeVideoClient

    env = {k: v for k, v in os.environ.items() if k != KEY_ENV}
    served = launch(tmp_path, "--pacing-lead", "off", "--log-level", "DEBUG", env=env)
    proc = served.proc
    children: set[int] = set()
    try:
        ready = served.ready_line()
        assert ready.startswith("rtvideo ready:"), ready + served.tail()
        children = served.children()
        commands = [Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0") for p in children]
        (triton,) = [c for c in commands if c and c[0].endswith(b"tritonserver")]
        (flag,) = [a.decode() for a in triton if a.startswith(b"--grpc-restricted-protocol=")]
        groups, _, key = flag.split("=", 1)[1].partition(f":{KEY_NAME}=")
        assert set(groups.split(",")) >= {"inference", "shared-memory", "logging", "model-config", "statistics"}
        assert "health" not in groups.split(",") and len(key) >= 32

        async def session() -> dict | None:
            async with RealtimeVideoClient(served.url) as c:
                await c.start("a lighthouse in fog", num_frames=9, seed=1)
                async for _ in c.chunks():
                    pass
                return c.done

        assert asyncio.run(asyncio.wait_for(session(), 60)) is not None  # the proxy holds the key
        url = f"127.0.0.1:{served.grpc_port}"
        assert _stream(url, _request(b'{"type":"session.ping"}', 5)).endswith(REFUSED)
        assert _stream(url, _request(b'{"type":"session.ping"}', 5), key_headers(key)) == '{"type":"session.pong"}'
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        assert proc.stdout is not None
        rest = proc.stdout.read()
        triton_log = tmp_path / "triton.log"
        for name, text in (
            ("stdout", ready + rest),
            ("stderr", served.log.read_text()),
            ("log", triton_log.read_text()),
        ):
            assert key not in text, f"the generated key is in the serve {name}"
    finally:
        end_all(proc, children)
