"""Where `rtvideo triton` takes its key from (rtvideo/standalone.py): the environment,
else a key file its owner alone reads, else a new key written to one (0600)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from rtvideo.standalone import key_source
from rtvideo.triton.access import KEY_ENV


@pytest.fixture(autouse=True)
def no_key_in_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)


def test_a_new_key_is_written_to_the_key_file_for_its_owner_alone(tmp_path: Path) -> None:
    path = tmp_path / "triton.key"
    source = key_source(path)
    assert path.read_text() == source.key + "\n" and len(source.key) == 64
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert str(path) in source.describe() and source.key not in source.describe()
    source.remove()
    assert path.exists()  # the operator's file stays: the next start reads the same key
    assert key_source(path).key == source.key


def test_without_a_key_file_a_temporary_one_is_removed_at_the_end() -> None:
    source = key_source(None)
    assert source.path is not None and stat.S_IMODE(source.path.stat().st_mode) == 0o600
    source.remove()
    assert not source.path.exists()


def test_the_environment_s_key_comes_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, "abc123")
    source = key_source(tmp_path / "triton.key")
    assert source.key == "abc123" and source.path is None
    assert not (tmp_path / "triton.key").exists()


def test_a_key_file_others_may_read_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "triton.key"
    path.write_text("abc123\n")
    os.chmod(path, 0o644)
    with pytest.raises(ValueError, match="others may read it"):
        key_source(path)
    os.chmod(path, 0o600)
    assert key_source(path).key == "abc123"


def test_a_key_file_without_a_usable_key_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "triton.key"
    path.write_text("two words\n")
    os.chmod(path, 0o600)
    with pytest.raises(ValueError):
        key_source(path)
