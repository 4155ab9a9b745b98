"""Plain HTTP calls the end-to-end tests make to a proxy: its recordings, its drain endpoint and
its metrics."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any


def http_base(ws_url: str) -> str:
    parts = urllib.parse.urlsplit(ws_url)
    return f"http://{parts.netloc}"


def fetch(
    url: str,
    *,
    token: str | None = None,
    method: str = "GET",
    headers: dict[str, str] | None = None,
    data: bytes | None = None,
) -> tuple[int, bytes, dict[str, str]]:
    request = urllib.request.Request(url, method=method, headers=dict(headers or {}), data=data)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read(), dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), dict(exc.headers)


def recording_url(base: str, rid: str, recording_token: str | None = None, file: str = "") -> str:
    """`/v1/recordings/{rid}[/file]`, with `?recording_token=` when one is given."""
    query = "" if recording_token is None else "?recording_token=" + urllib.parse.quote(recording_token)
    return f"{base}/v1/recordings/{rid}{'/' + file if file else ''}{query}"


def finished(
    base: str, rid: str, token: str | None = None, timeout: float = 30.0, recording_token: str | None = None
) -> dict[str, Any]:
    """The manifest once the recording is no longer live (it is closed off the event loop);
    `token` goes as the bearer (the client's or the operator's), `recording_token` in the query."""
    deadline = time.monotonic() + timeout
    while True:
        status, body, _ = fetch(recording_url(base, rid, recording_token), token=token)
        manifest = json.loads(body) if status == 200 else {}
        if manifest.get("status") not in (None, "recording"):
            return manifest
        assert time.monotonic() < deadline, (status, body)
        time.sleep(0.1)


def drain(server: Any, endpoint: str, method: str = "POST") -> tuple[int, dict[str, Any]]:
    """POST (drain) or DELETE (take back) `/v1/endpoints/{endpoint}/drain` on a proxy, with its
    operator's credential (`admin_token`)."""
    url = f"http://127.0.0.1:{server.port}/v1/endpoints/{endpoint}/drain"
    status, body, headers = fetch(url, method=method, token=server.settings.admin_token)
    return status, json.loads(body) if headers.get("Content-Type") == "application/json" else {}


def metric_values(port: int) -> dict[str, float]:
    """The proxy's /metrics on 127.0.0.1:`port`: each sample (name and labels) with its value."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
