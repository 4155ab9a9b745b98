"""What the local replicas recipe writes (rtvideo/replicas_config.py): an HAProxy configuration
that HAProxy itself accepts, with a check of every proxy's /readyz and no query in its log, and a
redis-server configuration that keeps the password out of the command line."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from rtvideo.replicas_config import haproxy_config, redis_config, write_private


def test_haproxy_checks_every_proxy_and_logs_no_query(tmp_path: Path) -> None:
    text = haproxy_config(8080, 8404, [9001, 9002, 9003], "roundrobin")
    assert "bind 127.0.0.1:8080" in text and "balance roundrobin" in text
    for i, port in enumerate((9001, 9002, 9003)):
        assert f"server proxy-{i} 127.0.0.1:{port} check" in text
    assert "uri /readyz" in text and "timeout tunnel" in text and "retry-on" in text
    assert "%HP" in text and "%HU" not in text and "option httplog" not in text  # paths, not queries
    if shutil.which("haproxy") is None:
        pytest.skip("haproxy is not installed (scripts/test.sh installs it)")
    config = tmp_path / "haproxy.cfg"
    config.write_text(text)
    checked = subprocess.run(["haproxy", "-c", "-f", str(config)], capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_redis_reads_its_password_from_a_file_only_its_owner_reads(tmp_path: Path) -> None:
    text = redis_config(6390, "s3cret", tmp_path, "64mb")
    assert "requirepass s3cret" in text and "bind 127.0.0.1" in text and 'save ""' in text
    assert "maxmemory 64mb" in text and "maxmemory-policy noeviction" in text
    assert "maxmemory" not in redis_config(6390, "s3cret", tmp_path, None)
    path = tmp_path / "redis.conf"
    path.write_text("old")
    path.chmod(0o644)
    write_private(path, text)  # in place of an earlier one, never its mode
    assert path.read_text() == text and path.stat().st_mode & 0o777 == 0o600
