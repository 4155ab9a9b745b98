"""What an operator sees: Prometheus metrics with the process's own, an access log without
secrets, and `rtvideo serve` with Triton on every address and its log on standard error."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from rtvideo.client.session import RealtimeVideoClient
from rtvideo.proxy.observability.accesslog import redact, redact_text
from rtvideo.proxy.observability.metrics import ProxyMetrics
from rtvideo.proxy.observability.session_timing import StreamTiming
from rtvideo.triton.access import KEY_ENV, generate_key
from rtvideo.triton.logs import STDERR, ServerLog
from rtvideo.triton.server import free_port, is_ready
from tests.support.processes import end_all
from tests.support.proxy_client import Ws, ws
from tests.support.proxy_host import run
from tests.support.serve_session import launch

OLD_FAMILIES = (  # counters without `_total`, as the parser names them
    "rtvideo_proxy_sessions_active",
    "rtvideo_proxy_sessions",
    "rtvideo_proxy_bytes_out",
    "rtvideo_proxy_chunks_out",
    "rtvideo_proxy_ack_latency_seconds",
    "rtvideo_proxy_errors",
    "rtvideo_proxy_rejected",
    "rtvideo_proxy_backend_up",
    "rtvideo_proxy_probe_latency_seconds",
    "rtvideo_proxy_probe_failures",
    "rtvideo_proxy_backend_restarts",
)


def samples(text: str) -> dict[str, dict[tuple, float]]:
    """family name → {(sample name, sorted labels): value}"""
    return {
        f.name: {(s.name, tuple(sorted(s.labels.items()))): s.value for s in f.samples}
        for f in text_string_to_metric_families(text)
    }


def test_metrics_parse_with_process_and_stream_histograms(proxies) -> None:
    server = proxies.server(start_timeout=9.5)  # a proxy of its own: exact counts

    async def body() -> list[dict]:
        async with ws(server.url) as conn:
            s = Ws(conn)
            await s.start("measured", num_frames=27, seed=2)
            await s.finish()
            return s.t.messages

    messages = run(body())
    media = sum(m["type"] == "video.chunk_metadata" and m["kind"] == "media" for m in messages)
    assert media == 3

    response = urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10)
    assert response.headers["Content-Type"].startswith("text/plain")
    families = samples(response.read().decode())
    for name in OLD_FAMILIES:
        assert name in families, name
    assert families["rtvideo_proxy_sessions"][("rtvideo_proxy_sessions_total", ())] == 1
    assert families["rtvideo_proxy_chunks_out"][("rtvideo_proxy_chunks_out_total", ())] == media + 1  # + trailer
    first = families["rtvideo_proxy_time_to_first_chunk_seconds"]
    assert first[("rtvideo_proxy_time_to_first_chunk_seconds_count", ())] == 1
    assert 0 < first[("rtvideo_proxy_time_to_first_chunk_seconds_sum", ())] < 60
    lead = families["rtvideo_proxy_chunk_lead_seconds"]
    assert lead[("rtvideo_proxy_chunk_lead_seconds_count", ())] == media
    assert lead[("rtvideo_proxy_chunk_lead_seconds_bucket", (("le", "+Inf"),))] == media
    rss = families["process_resident_memory_bytes"][("process_resident_memory_bytes", ())]
    assert rss > 10 * 2**20

    # OpenMetrics for a scraper that asks for it
    request = urllib.request.Request(
        f"http://127.0.0.1:{server.port}/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}
    )
    response = urllib.request.urlopen(request, timeout=10)
    assert response.headers["Content-Type"].startswith("application/openmetrics-text")
    assert response.read().decode().endswith("# EOF\n")


def test_stream_timing_measures_lead_against_playback() -> None:
    now = [100.0]
    metrics = ProxyMetrics()
    timing = StreamTiming(metrics, clock=lambda: now[0])
    timing.started()
    now[0] += 0.5
    timing.taken({"type": "video.start", "config": {"fps": 10}})
    chunk = {"type": "video.chunk_metadata", "kind": "media", "num_frames": 10}
    timing.taken(chunk)  # 0.5 s after the start; 1 s of video, just begun: 1 s ahead
    now[0] += 3.0
    timing.taken(chunk)  # 2 s of video after 3 s of playback: 1 s behind
    timing.taken({"type": "video.chunk_metadata", "kind": "trailer", "num_frames": 0})
    families = samples(metrics.render())
    assert (
        families["rtvideo_proxy_time_to_first_chunk_seconds"][("rtvideo_proxy_time_to_first_chunk_seconds_sum", ())]
        == 0.5
    )
    lead = families["rtvideo_proxy_chunk_lead_seconds"]
    assert lead[("rtvideo_proxy_chunk_lead_seconds_count", ())] == 2
    assert lead[("rtvideo_proxy_chunk_lead_seconds_bucket", (("le", "-1.0"),))] == 1
    assert lead[("rtvideo_proxy_chunk_lead_seconds_bucket", (("le", "1.0"),))] == 2
    assert lead[("rtvideo_proxy_chunk_lead_seconds_bucket", (("le", "0.5"),))] == 1


def test_access_log_masks_the_token(proxies, caplog: pytest.LogCaptureFixture) -> None:
    server = proxies.server(token="s3cret")
    caplog.set_level(logging.DEBUG, logger="tornado")

    async def body() -> None:
        async with ws(server.url + "?token=s3cret&prompt=x") as conn:
            s = Ws(conn)
            await s.start("secretive", num_frames=9)
            await s.finish()

    run(body())
    for url, headers in (
        (f"http://127.0.0.1:{server.port}/metrics?token=not-s3cret", {}),
        (f"http://127.0.0.1:{server.port}/metrics", {"Authorization": "Bearer s3cret"}),
    ):
        try:
            urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10).read()
        except urllib.error.HTTPError as exc:
            assert exc.code == 401
    deadline = time.monotonic() + 5
    while "/metrics (" not in caplog.text and time.monotonic() < deadline:  # logged on the proxy's loop
        time.sleep(0.05)
    access = [r for r in caplog.records if r.name == "tornado.access"]
    text = "\n".join(r.getMessage() for r in access)
    assert "s3cret" not in caplog.text, caplog.text
    assert "101 GET /v1/realtime/video?token=***&prompt=x" in text, text
    refused = [r for r in access if r.getMessage().startswith("401 ")]
    assert refused and all(r.levelno == logging.WARNING for r in refused)


def test_redaction_rules() -> None:
    assert redact("/v1/realtime/video?token=abc&token=def") == "/v1/realtime/video?token=***&token=***"
    assert redact("/?%74oken=abc&q=token%3Dx") == "/?%74oken=***&q=token%3Dx"
    assert redact("/healthz") == "/healthz"
    assert (
        redact_text("HTTPServerRequest(uri='/v1?token=abc', Authorization: Bearer xyz)")
        == "HTTPServerRequest(uri='/v1?token=***', Authorization: Bearer ***)"
    )


def test_relayed_log_goes_to_stderr_and_keeps_a_tail(capsys: pytest.CaptureFixture) -> None:
    log = ServerLog(STDERR)
    proc = subprocess.Popen(
        ["sh", "-c", "echo starting; echo 'E1130 00:00:00.0 1 x.cc:1] boom' >&2; exit 3"],
        stdout=log.open(),
        stderr=subprocess.STDOUT,
    )
    log.spawned()
    assert proc.wait(10) == 3
    failure = str(log.failure("tritonserver exited with code 3 while starting", ["sh"]))
    assert "errors in the log:\nE1130 00:00:00.0 1 x.cc:1] boom" in failure and "starting\n" in failure
    assert "(stderr)" in failure and log.path is None
    err = capsys.readouterr().err
    assert "starting\n" in err and "boom" in err


def test_a_temp_log_is_one_file_across_restarts() -> None:
    """Without a log target every start appends to one temp file, so a server restarted again
    and again (the supervisor's restarts) leaves one file, not one per try."""
    log = ServerLog()
    try:
        for run in ("first", "second"):
            proc = subprocess.Popen(["echo", f"{run} run"], stdout=log.open(), stderr=subprocess.STDOUT)
            log.spawned()
            assert proc.wait(10) == 0
            log.close()
        assert log.path is not None and log.path.read_text() == "first run\nsecond run\n"
    finally:
        if log.path is not None:
            log.path.unlink()


def test_serve_triton_on_every_address_logging_to_stderr(tmp_path: Path) -> None:
    """One `rtvideo serve --triton-host 0.0.0.0 --triton-log -`: Triton's gRPC answers on loopback,
    and the model's per-session line reaches the serve process's standard error. Published, Triton
    needs a key (given here in the environment) and the serve warns that this Triton release
    (2.51, nvidia-pytriton's) carries the shared-memory CVEs; the key is in no line."""
    key = generate_key()
    served = launch(
        tmp_path,
        *("--triton-host", "0.0.0.0", "--pacing-lead", "off", "--frames-per-chunk", "6"),
        triton_log="-",
        env={**os.environ, KEY_ENV: key},
    )
    proc = served.proc
    children: set[int] = set()
    try:
        line = served.ready_line()
        assert line.endswith(f"(triton grpc 127.0.0.1:{served.grpc_port})\n"), line + served.tail()
        warning = [entry for entry in served.log.read_text().splitlines() if "CVE-2025-23319" in entry]
        assert warning and "WARNING" in warning[0] and "2.51.0" in warning[0], served.tail()
        assert is_ready(f"127.0.0.1:{served.grpc_port}")
        children = served.children()
        commands = [Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0") for p in children]
        triton = [c for c in commands if c and c[0].endswith(b"tritonserver")]
        assert triton and b"--grpc-address=0.0.0.0" in triton[0]
        assert b"--metrics-address=0.0.0.0" in triton[0]

        async def session() -> str:
            async with RealtimeVideoClient(served.url) as c:
                start = await c.start("a lighthouse in fog", num_frames=6, seed=1)
                async for _ in c.chunks():
                    pass
                return start["request_id"]

        request_id = asyncio.run(asyncio.wait_for(session(), 60))
        wanted = f"request_id={request_id} "
        deadline = time.monotonic() + 30
        while not any(wanted in entry and " started" in entry for entry in served.log.read_text().splitlines()):
            assert time.monotonic() < deadline, "no per-session line:\n" + served.tail()
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        assert proc.stdout is not None and key not in served.log.read_text() + line + proc.stdout.read()
    finally:
        end_all(proc, children)


def test_a_slow_start_shows_the_models_load_state_not_a_silent_wait(tmp_path: Path) -> None:
    """`rtvideo serve`'s wait for its Triton calls back with the models' states while they load
    (`--triton-start-timeout`, progress every 15 s; here every 0.2 s)."""
    from rtvideo.triton.command import TritonConfig
    from rtvideo.triton.model_repo import derive_model
    from rtvideo.triton.server import TritonServer

    repo = tmp_path / "repository"
    derive_model(repo, "realtime_video", {"render_workers": "0"})
    seen: list[tuple[float, str]] = []
    key = generate_key()
    server = TritonServer(
        TritonConfig(repo, grpc_port=free_port(), http_port=free_port(), metrics_port=free_port(), key=key),
        stdout=tmp_path / "triton.log",
    )
    server.spawn()
    try:
        server.wait_ready(300, lambda elapsed, states: seen.append((elapsed, states)), every=0.2)
        assert seen, "no progress while the model loaded"
        assert all(later >= earlier for (earlier, _), (later, _) in itertools.pairwise(seen))
        assert any("realtime_video: " in states for _, states in seen) or all(
            states == "server not answering yet" for _, states in seen
        )
        assert server.model_states() == "realtime_video: READY"
    finally:
        server.stop()
