"""Credentials stay out of URLs and logs (issue 46 item 5; docs/security.md "Secrets in URLs and
logs"): the access log masks every credential name the proxy knows, every query value the proxy
reads is one of them, the operator's credential is never taken from a URL, and a store URL is
shown without its password everywhere: the real `rtvideo serve`'s error and log, `/healthz`,
`/metrics`, with a real Redis that asks for the password."""

from __future__ import annotations

import ast
import asyncio
import json
import logging
import os
import subprocess
import urllib.parse
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from rtvideo.proxy.edge import guest_doors
from rtvideo.proxy.edge.access import query_value
from rtvideo.proxy.observability.accesslog import redact, redact_text
from rtvideo.proxy.store import check_store
from rtvideo.redaction import NEVER_IN_QUERY, QUERY_CREDENTIALS, SECRET_PARAMS, is_secret_param, redact_url
from tests.support.http_calls import fetch
from tests.support.processes import RTVIDEO, stop_serve
from tests.support.proxy_host import ProxyHost
from tests.support.serve_session import launch

PROXY = Path(__file__).resolve().parents[2] / "proxy"
SECRET = "s3cretPW"
#: the ways a Tornado handler (or anything else) can read a request's query or body arguments
ARGUMENT_READERS = (
    "query_arguments",
    "body_arguments",
    "get_argument",
    "get_arguments",
    "get_query_argument",
    "get_query_arguments",
    "get_body_argument",
    "get_body_arguments",
    "request.arguments",
    "parse_qs",
)


# --- the names -----------------------------------------------------------------------------------
def _names_read_from_queries() -> dict[str, str]:
    """Every query parameter name the proxy's code reads, with where: the literal (or f-string)
    second argument of each `query_value(...)` call under proxy/, an f-string's `{...kind}`
    expanded to the guest doors' kinds."""
    kinds = [cls.kind for cls in vars(guest_doors).values() if isinstance(cls, type) and getattr(cls, "kind", "")]
    assert sorted(kinds) == ["steer", "watch"], kinds
    found: dict[str, str] = {}
    for path in sorted(PROXY.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "query_value"):
                continue
            where = f"{path.relative_to(PROXY.parent)}:{node.lineno}"
            name = node.args[1]
            if isinstance(name, ast.Constant) and isinstance(name.value, str):
                found[name.value] = where
            elif isinstance(name, ast.JoinedStr):
                text = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in name.values)
                assert text == "{}_token", f"{where}: an f-string name the test cannot expand: {ast.unparse(name)}"
                found.update({text.format(kind): where for kind in kinds})
            else:
                pytest.fail(f"{where}: query_value with a computed name: {ast.unparse(name)}")
    return found


def test_the_proxy_reads_query_values_only_through_query_value() -> None:
    """One reader of query values (rtvideo.proxy.edge.access.query_value), so the names below are all."""
    readers = []
    for path in sorted(PROXY.rglob("*.py")):
        text = path.read_text()
        readers += [f"{path.relative_to(PROXY.parent)}: {word}" for word in ARGUMENT_READERS if word in text]
    assert readers == ["proxy/edge/access.py: query_arguments"], readers


def test_every_query_value_the_proxy_reads_is_a_listed_credential_and_is_masked() -> None:
    names = _names_read_from_queries()
    assert set(names) == set(QUERY_CREDENTIALS), names  # all four are read somewhere, nothing else
    for name in names:
        assert is_secret_param(name), name
        line = f"101 GET /v1/realtime/video?{name}=VALUE-{name}&prompt=x (127.0.0.1) 1.00ms"
        assert f"VALUE-{name}" not in redact(f"/v1/realtime/video?{name}=VALUE-{name}&prompt=x")
        assert f"VALUE-{name}" not in redact_text(line), line


@pytest.mark.parametrize("name", sorted(SECRET_PARAMS))
def test_every_secret_name_is_masked_however_it_is_written(name: str) -> None:
    encoded = "".join(f"%{ord(c):02X}" for c in name[:2]) + name[2:]
    for written in (name, name.upper(), encoded):
        uri = f"/v1/recordings?a=1&{written}=VALUE&b=2"
        assert redact(uri) == f"/v1/recordings?a=1&{written}=***&b=2", (written, redact(uri))
        assert "VALUE" not in redact_text(f"GET {uri} (127.0.0.1)"), written
        assert "VALUE" not in redact_url(f"s3://bucket/prefix?{written}=VALUE"), written


def test_admin_token_and_a_new_token_name_are_masked() -> None:
    """The name issue 46 found in clear, and one nobody listed yet (`..._token`) masked all the same."""
    assert "admin_token" in NEVER_IN_QUERY and "admin_token" not in QUERY_CREDENTIALS
    assert redact("/recordings.html?admin_token=OPS") == "/recordings.html?admin_token=***"
    assert redact("/x?new_thing_token=T&page=2") == "/x?new_thing_token=***&page=2"
    assert redact("/x?prompt=a%20token%3Dx&page=2") == "/x?prompt=a%20token%3Dx&page=2"  # a value is no name


def test_the_docs_name_every_credential_the_list_has() -> None:
    """docs/security.md "Secrets in URLs and logs" states the same list (a name added to
    rtvideo.redaction must be documented)."""
    text = (PROXY.parent / "docs" / "security.md").read_text()
    section = text[text.index("### Secrets in URLs and logs") :]
    section = section[: section.index("\n### ", 1)]
    missing = [name for name in (*QUERY_CREDENTIALS, *NEVER_IN_QUERY) if f"`{name}`" not in section]
    assert missing == [], missing


def test_query_value_takes_only_listed_credentials() -> None:
    with pytest.raises(ValueError, match="admin_token"):
        query_value(None, "admin_token")  # type: ignore[arg-type]


def test_redact_url() -> None:
    assert redact_url("redis://:pw@h:6379/0") == "redis://:***@h:6379/0"
    assert redact_url("redis://user:pw@h:6379/0") == "redis://user:***@h:6379/0"
    assert redact_url("redis://pw@h:6379/0") == "redis://***@h:6379/0"  # Redis takes a bare userinfo for a password
    assert redact_url("rediss://:pw@[::1") == "rediss://:***@[::1"  # malformed: still masked, no exception
    assert redact_url("redis://:pw@h:notaport/0") == "redis://:***@h:notaport/0"
    assert redact_url("unix:///run/redis.sock?password=pw&db=1") == "unix:///run/redis.sock?password=***&db=1"
    assert redact_url("s3://AKIA:SECRET@bucket/p") == "s3://AKIA:***@bucket/p"
    assert redact_url("memory") == "memory" and redact_url("http://collector:4317") == "http://collector:4317"
    assert "pw" not in redact_text("failed: redis://user:pw@h:6379/0 refused")


@pytest.mark.parametrize(
    "url",
    [
        f"redis://:{SECRET}@host:notaport/0",
        f"xredis://:{SECRET}@host:6379/0",
        f"redis://:{SECRET}@[::1/0",
        f"redis://:{SECRET}@host:6379/0?socket_timeout=soon",
    ],
)
def test_a_malformed_store_url_is_refused_without_its_password(url: str) -> None:
    with pytest.raises(ValueError) as caught:
        check_store(url)
    assert SECRET not in str(caught.value) and "***" in str(caught.value), caught.value
    error = caught.value
    assert error.__cause__ is None and (error.__context__ is None or error.__suppress_context__), (
        "a cause shows the URL"
    )


# --- the real command ----------------------------------------------------------------------------
def test_rtvideo_serve_refuses_a_malformed_store_url_without_showing_its_password(tmp_path: Path) -> None:
    """Issue 46: `rtvideo serve --session-store 'redis://:s3cret@host:notaport/0'` printed a
    traceback; now one line, exit 2, the password masked (on the command line and from the
    environment, where a password belongs)."""
    url = f"redis://:{SECRET}@host:notaport/0"
    runs = [
        subprocess.run(
            [str(RTVIDEO), "serve", "--triton-url", "127.0.0.1:1", "--session-store", url],
            capture_output=True,
            text=True,
            timeout=120,
        ),
        subprocess.run(
            [str(RTVIDEO), "serve", "--triton-url", "127.0.0.1:1"],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "RTVIDEO_SESSION_STORE": url},
        ),
    ]
    for run in runs:
        assert run.returncode == 2, (run.returncode, run.stderr[-2000:])
        assert SECRET not in run.stdout + run.stderr, run.stderr
        assert "Traceback" not in run.stderr, run.stderr
        assert run.stderr.startswith("rtvideo serve: error: --session-store redis://:***@host:notaport/0"), run.stderr


async def _add_user(redis_url: str, user: str) -> None:
    client = aioredis.from_url(redis_url)
    try:
        # a user of its own: the session's other tests keep the password-less default user
        await client.execute_command("ACL", "SETUSER", user, "on", f">{SECRET}", "~*", "&*", "+@all")
    finally:
        await client.aclose()


def test_rtvideo_serve_shows_its_store_url_without_the_password(tmp_path: Path, redis_url: str) -> None:
    """A store URL with a password, given in the environment as docs/serving.md says: the start-up
    line names the store with the password masked, the store is reached with it (`/healthz`
    says shared), and neither standard error, standard output, `/healthz` nor `/metrics` shows it."""
    asyncio.run(_add_user(redis_url, "rtv-secrets"))
    parts = urllib.parse.urlsplit(redis_url)
    url = f"redis://rtv-secrets:{SECRET}@{parts.netloc}{parts.path}"
    served = launch(
        tmp_path,
        "--triton-url",
        "127.0.0.1:1",
        "--recordings",
        str(tmp_path / "rec"),
        own_triton=False,
        env={**os.environ, "RTVIDEO_SESSION_STORE": url},
    )
    try:
        ready = served.ready_line(120)
        assert ready.startswith("rtvideo ready:"), served.tail()
        _, health = served.get("/healthz")
        assert health["session_store"] == "shared", health
        _, metrics, _ = fetch(f"http://127.0.0.1:{served.port}/metrics")
        shown = json.dumps(health) + metrics.decode()
        assert SECRET not in shown
    finally:
        stop_serve(served.proc)
    out = ready + (served.proc.stdout.read() if served.proc.stdout else "")
    log = served.log.read_text()
    assert SECRET not in log + out, log
    started = [line for line in log.splitlines() if "proxy listening on" in line]
    assert started and f"session store redis://rtv-secrets:***@{parts.netloc}{parts.path}" in started[0], log


# --- the operator's credential is a header, never a query value ---------------------------------------
def test_the_operator_credential_is_never_taken_from_a_url(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """`?admin_token=` opens nothing (the listing, another's recording, the drain) where the same
    value as `Authorization: Bearer` does; and the access log writes it masked."""
    admin = "operators-credential-" + SECRET
    caplog.set_level(logging.INFO, logger="tornado.access")
    host = ProxyHost("127.0.0.1:1")  # no Triton: none of these routes needs one
    try:
        server = host.server(recordings=str(tmp_path / "rec"), admin_token=admin, token="client-token")
        base = f"http://127.0.0.1:{server.port}"
        query = urllib.parse.urlencode({"admin_token": admin})
        headers = {"Host": "localhost"}
        listing, _, _ = fetch(f"{base}/v1/recordings?{query}", headers=headers)
        assert listing == 401, listing  # neither the client's token nor the operator's: refused
        with_client, body, _ = fetch(f"{base}/v1/recordings?{query}&token=client-token", headers=headers)
        assert with_client == 403 and b"send it as a bearer" in body, (with_client, body)
        drain, _, _ = fetch(f"{base}/v1/endpoints/127.0.0.1:1/drain?{query}", method="POST", headers=headers)
        assert drain in (401, 403), drain
        as_bearer, _, _ = fetch(f"{base}/v1/recordings", token=admin, headers=headers)
        assert as_bearer == 200, as_bearer
    finally:
        host.close()
    access = [r.getMessage() for r in caplog.records if r.name == "tornado.access"]
    assert any("admin_token=***" in line for line in access), access
    assert admin not in caplog.text
