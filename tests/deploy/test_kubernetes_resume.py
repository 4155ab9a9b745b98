"""deploy/kubernetes/ and a resume: any replica serves any session (the shared session store), and
the proxies' Service keeps ClientIP affinity for locality only (docs/operations.md "Resume and
watchers")."""

from __future__ import annotations

import pytest

from rtvideo.proxy.settings import MAX_RESUME_GRACE_SECONDS
from tests.support.paths import REPO_ROOT

yaml = pytest.importorskip("yaml")

SERVICE = REPO_ROOT / "deploy/kubernetes/proxy-service.yaml"


def comment_above(text: str, key: str) -> str:
    """The comment lines right above the line that sets `key`, joined."""
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip().startswith(f"{key}:"))
    above: list[str] = []
    for line in reversed(lines[:at]):
        if not line.strip().startswith("#"):
            break
        above.insert(0, line.strip().lstrip("#").strip())
    return " ".join(above)


def test_the_proxy_service_keeps_a_client_on_one_replica_for_locality_only() -> None:
    (service,) = [d for d in yaml.safe_load_all(SERVICE.read_text()) if d]
    assert service["kind"] == "Service" and service["spec"]["sessionAffinity"] == "ClientIP"
    # longer than any resume grace: a client that comes back finds the replica that holds its session
    assert service["spec"]["sessionAffinityConfig"]["clientIP"]["timeoutSeconds"] >= MAX_RESUME_GRACE_SECONDS
    why = comment_above(SERVICE.read_text(), "sessionAffinity")
    assert why.startswith("Locality only: any replica serves any session"), why
    assert "invalid_resume" not in why and "must reach" not in why  # what it said before the store
