"""Every field of a `session.start` is bounded, named or not (`check_object_bounds`): an
unknown or unlisted field (the proxy's own options) costs no more than a free-form object
(keys and items, depth, bytes), a start has a bounded number of fields and field-name length,
and each refusal is `invalid_start` naming the bound. The proxy runs this before a start is
recorded or forwarded (tests/e2e/test_tenancy.py tries it through a real proxy)."""

from __future__ import annotations

import json
import time

import pytest

from rtvideo.core.errors import ErrorCode, ProtocolError
from rtvideo.core.start_request import (
    MAX_FIELD_NAME_CHARS,
    MAX_OBJECT_BYTES,
    MAX_OBJECT_DEPTH,
    MAX_OBJECT_ENTRIES,
    MAX_START_FIELDS,
    check_first_message,
    check_object_bounds,
)

BASE = {"type": "session.start", "prompt": "a quiet harbour"}


def refusal(start: dict) -> str:
    with pytest.raises(ProtocolError) as caught:
        check_object_bounds(check_first_message(json.dumps(start)))
    assert caught.value.code is ErrorCode.INVALID_START
    assert len(caught.value.message) < 200  # nothing of the client's field is echoed at length
    return caught.value.message


@pytest.mark.parametrize("name", ["unknown_field", "from_recording", "record", "lora", "extra_params"])
def test_a_wide_field_is_refused_naming_the_bound(name: str) -> None:
    message = refusal({**BASE, name: {f"k{i}": 0 for i in range(215_000)}})
    assert f"{name} has more than {MAX_OBJECT_ENTRIES} keys and items" in message


def test_a_deep_unknown_field_is_refused() -> None:
    deep = json.loads("[" * 20 + "]" * 20)  # within the decoder's own 32 levels
    assert f"nested deeper than {MAX_OBJECT_DEPTH} levels" in refusal({**BASE, "unknown": deep})
    assert f"nested deeper than {MAX_OBJECT_DEPTH} levels" in refusal({**BASE, "video_reference": deep})


def test_a_huge_unknown_field_is_refused() -> None:
    assert f"unknown is larger than {MAX_OBJECT_BYTES} bytes" in refusal({**BASE, "unknown": "x" * 3_000_000})
    huge = {"unknown": ["x" * 1000] * 200}  # few items, many bytes
    assert f"larger than {MAX_OBJECT_BYTES} bytes as JSON" in refusal({**BASE, **huge})
    assert f"prompt is larger than {MAX_OBJECT_BYTES} bytes" in refusal({**BASE, "prompt": "x" * 100_000})


def test_many_fields_or_a_long_field_name_are_refused() -> None:
    many = {f"f{i}": 0 for i in range(MAX_START_FIELDS)}
    assert f"more than {MAX_START_FIELDS} fields" in refusal({**BASE, **many})
    long = "n" * 100_000
    assert f"longer than {MAX_FIELD_NAME_CHARS} characters" in refusal({**BASE, long: 1})


def test_a_4_mb_start_is_refused_in_little_time() -> None:
    """The issue's start: 215,000 keys under an unknown field, near the 4 MB start limit."""
    text = json.dumps({**BASE, "pad": {f"k{i}": i for i in range(215_000)}})
    assert 3_000_000 < len(text) < 4 * 1024 * 1024  # within the start's own limit
    began = time.process_time()
    with pytest.raises(ProtocolError, match="pad has more than 256 keys"):
        check_object_bounds(check_first_message(text))
    assert time.process_time() - began < 30  # bounds a hang only; it takes milliseconds


def test_legitimate_starts_pass() -> None:
    check_object_bounds(BASE)
    check_object_bounds({**BASE, "record": True, "resumable": True, "seed": 7, "size": "256x256"})
    check_object_bounds({**BASE, "from_recording": {"recording_id": "r" * 32, "generation_chunk_index": 3}})
    check_object_bounds({**BASE, "image_reference": "data:image/png;base64," + "A" * 2_000_000})  # the start bounds it
    check_object_bounds({**BASE, "extra_params": {f"k{i}": i for i in range(MAX_OBJECT_ENTRIES)}})
    prompts = [{"text": f"scene {i}", "weight": 1} for i in range(8)]
    check_object_bounds({"type": "session.start", "prompts": prompts})
