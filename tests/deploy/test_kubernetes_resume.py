"""deploy/kubernetes/ sends a resume to the replica that holds the session (docs/operations.md)."""

from __future__ import annotations

import pytest

from tests.support.paths import REPO_ROOT

yaml = pytest.importorskip("yaml")


def test_the_proxy_service_keeps_a_client_on_one_replica() -> None:
    (service,) = [d for d in yaml.safe_load_all((REPO_ROOT / "deploy/kubernetes/proxy-service.yaml").read_text()) if d]
    assert service["kind"] == "Service" and service["spec"]["sessionAffinity"] == "ClientIP"
    # longer than any resume grace (--resume-grace-seconds is at most 300 s)
    assert service["spec"]["sessionAffinityConfig"]["clientIP"]["timeoutSeconds"] >= 300
