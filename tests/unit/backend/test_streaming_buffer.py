"""`streaming_buffer_seconds`, as vLLM-Omni's newer clients send it in `session.start` ("generation
pauses once that far ahead of the reported playhead"): the session's lead where the generator
paces (the built-in one, when the deployment paces), else listed in `config.ignored_fields`."""

from __future__ import annotations

import json

import pytest

from rtvideo.backend.loading.settings import BackendSettings
from rtvideo.backend.runtime.session import Limits, session_limits
from rtvideo.core.errors import ProtocolError
from rtvideo.core.session_config import resolve_session_config
from rtvideo.core.start_request import check_first_message, validate_start
from tests.support.streams import schema_errors

START = {"type": "session.start", "prompt": "a harbour", "streaming_buffer_seconds": 1.5}
LIMITS = Limits(pacing_lead_chunks=1.0, max_session_seconds=60.0, stall_timeout_seconds=60.0)


def _config(settings: BackendSettings, **fields: object):  # type: ignore[no-untyped-def]
    return resolve_session_config(
        validate_start(check_first_message(json.dumps({**START, **fields}))), settings.capabilities("m")
    )


def test_where_the_generator_paces_it_is_the_sessions_lead() -> None:
    config = _config(BackendSettings())  # 16 fps, chunks of 9
    assert config.to_json()["ignored_fields"] == [] and config.streaming_buffer_seconds == 1.5
    assert session_limits(config, LIMITS).pacing_lead_chunks == pytest.approx(1.5 * 16 / 9)
    plain = _config(BackendSettings(), streaming_buffer_seconds=None)
    assert session_limits(plain, LIMITS) is LIMITS  # no ask: the model's own lead


@pytest.mark.parametrize(
    "settings",
    [
        BackendSettings(pacing_lead_chunks=None),  # an unpaced deployment
        BackendSettings(generator="vllm_omni", width=640, height=384),  # an engine is not held back
    ],
)
def test_where_it_does_not_pace_it_is_ignored(settings: BackendSettings) -> None:
    config = _config(settings)
    assert config.to_json()["ignored_fields"] == ["streaming_buffer_seconds"]
    assert config.streaming_buffer_seconds is None
    assert session_limits(config, LIMITS) is LIMITS


@pytest.mark.parametrize("bad", [0, -1, 61, "1.5", True])
def test_it_is_a_positive_number_of_seconds_up_to_a_minute(bad: object) -> None:
    with pytest.raises(ProtocolError, match="streaming_buffer_seconds"):
        validate_start(check_first_message(json.dumps({**START, "streaming_buffer_seconds": bad})))


def test_the_schema_takes_it() -> None:
    assert schema_errors(START, "client_messages") == []
    assert schema_errors({**START, "streaming_buffer_seconds": 0}, "client_messages")
