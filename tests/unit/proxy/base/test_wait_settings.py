"""The proxy's waits (a lease, a resume's probe, the waiting share's grace and hold) are settings
with the documented defaults, and no flag: the tests shorten them, an operator has no need to."""

from __future__ import annotations

import argparse

import pytest

from rtvideo.proxy import settings as proxy_settings
from rtvideo.proxy.settings import (
    AWAITING_PLACE_SECONDS,
    AWAITING_START_GRACE_SECONDS,
    TAKEOVER_MARGIN_SECONDS,
    ProxySettings,
)
from rtvideo.proxy.store.base import LEASE_SECONDS

WAITS = (
    "lease_seconds",
    "resume_probe_seconds",
    "awaiting_start_grace_seconds",
    "awaiting_place_seconds",
    "whep_connect_seconds",
)


def test_the_defaults_are_the_documented_figures() -> None:
    s = ProxySettings()
    assert (s.lease_seconds, s.resume_probe_seconds) == (LEASE_SECONDS, 2.0) == (3.0, 2.0)
    assert (s.awaiting_start_grace_seconds, s.awaiting_place_seconds) == (AWAITING_START_GRACE_SECONDS, 4.0)
    assert AWAITING_PLACE_SECONDS == 4.0
    assert s.whep_connect_seconds == 30.0  # docs/protocol.md: ICE not connected 30 s after the answer
    assert s.takeover_wait_seconds == LEASE_SECONDS + TAKEOVER_MARGIN_SECONDS == 5.0
    assert s.store_keep_seconds == s.resume_grace_seconds + LEASE_SECONDS


def test_a_shorter_lease_shortens_what_follows_from_it() -> None:
    s = ProxySettings(lease_seconds=1.0, resume_grace_seconds=10.0)
    assert s.takeover_wait_seconds == 1.0 + TAKEOVER_MARGIN_SECONDS
    assert s.store_keep_seconds == 11.0


def test_the_waits_have_no_flag_nor_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in WAITS:
        monkeypatch.setenv(f"RTVIDEO_{name.upper()}", "0.5")
    parser = argparse.ArgumentParser()
    proxy_settings.add_arguments(parser)
    flags = {flag for action in parser._actions for flag in action.option_strings}
    assert "--resume-grace-seconds" in flags  # the operator's settings keep theirs
    for name in WAITS:
        assert "--" + name.replace("_", "-") not in flags
    built = proxy_settings.from_namespace(parser.parse_args([]))
    assert all(getattr(built, name) == getattr(ProxySettings(), name) for name in WAITS)  # the environment is not read


@pytest.mark.parametrize(
    "bad",
    [
        {"lease_seconds": 0.0},
        {"resume_probe_seconds": -1.0},
        {"awaiting_start_grace_seconds": -0.1},
        {"awaiting_place_seconds": -1.0},
    ],
)
def test_a_wait_out_of_range_is_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=next(iter(bad))):
        ProxySettings(**bad)
