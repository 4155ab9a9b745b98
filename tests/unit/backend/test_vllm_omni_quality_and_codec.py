"""A start's `quality` and `extra_params.video_codec_options` on the vllm_omni generator, against
what vLLM-Omni 0.30's streaming endpoint does with them (read in the pinned wheel).

`quality` is set on the engine request's sampling params, as the endpoint sets it; the codec
options configure OUR encoder where they map (CRF, preset, keyframe interval) and are never sent
to the engine; the rest are listed in `config.ignored_fields`; a bad value refuses the start.
The encoder's output is decoded with PyAV to see the options applied.
"""

from __future__ import annotations

import io
import json
from typing import Any

import av
import numpy as np
import pytest

from rtvideo.backend.loading.settings import BackendSettings
from rtvideo.backend.media.encoder import FragmentedMp4Encoder
from rtvideo.core import codec_options
from rtvideo.core.codec_options import EncoderOptions
from rtvideo.core.errors import ErrorCode, ProtocolError
from rtvideo.core.session_config import resolve_session_config
from rtvideo.core.start_request import check_first_message, validate_start
from tests.support.vllm_omni_wheel import wheel_source
from tests.unit.backend.test_vllm_omni_presets import engine_params

STREAM = "vllm_omni/entrypoints/openai/serving_video_output_stream.py"


def _start(**fields: Any) -> Any:
    return validate_start(check_first_message(json.dumps({"type": "session.start", "prompt": "a reef", **fields})))


def _omni() -> BackendSettings:
    return BackendSettings.from_parameters({"generator": "vllm_omni", "width": "640", "height": "384"})


# --- quality ---------------------------------------------------------------------------------------
def test_the_endpoint_sets_quality_on_the_sampling_params_when_given() -> None:
    stream = wheel_source(STREAM)
    assert 'if "quality" in provided_fields:\n            gen_params.quality = request.quality' in stream
    assert "quality: str | None = None" in wheel_source("vllm_omni/inputs/data.py")


def test_quality_reaches_the_engine_request_and_is_not_ignored() -> None:
    config = resolve_session_config(_start(quality="high"), _omni().capabilities("m"))
    assert "quality" not in config.ignored_fields and config.sampling["quality"] == "high"
    params = engine_params(config, 33, {})
    assert params.quality == "high"
    # not given: the model's default policy (None), as the endpoint leaves it
    plain = resolve_session_config(_start(), _omni().capabilities("m"))
    assert "quality" not in plain.sampling and engine_params(plain, 33, {}).quality is None
    # the built-in generator has no such policy: it stays ignored there
    builtin = resolve_session_config(_start(quality="high"), BackendSettings().capabilities("m"))
    assert builtin.ignored_fields == ("quality",)


def test_a_quality_outside_the_wheels_levels_is_refused() -> None:
    with pytest.raises(ProtocolError, match="quality must be one of"):
        _start(quality="best")


# --- video_codec_options ---------------------------------------------------------------------------
def test_the_endpoint_gives_them_to_its_encoder_as_x264_options() -> None:
    stream = wheel_source(STREAM)
    assert 'video_codec_options = {"preset": "ultrafast", "threads": "0", "tune": "zerolatency"}' in stream
    assert 'video_codec_options = request.extra_params["video_codec_options"]' in stream
    media = wheel_source("vllm_omni/diffusion/utils/media_utils.py")
    assert 'options: dict[str, object] = {"crf": str(crf)}' in media and "options.update(video_codec_options)" in media


def test_mapped_options_configure_our_encoder_and_are_not_sent_to_the_engine() -> None:
    options = {"crf": "28", "preset": "veryfast", "g": 8, "tune": "zerolatency", "threads": "0", "profile": "high"}
    config = resolve_session_config(
        _start(extra_params={"video_codec_options": options, "k": 1}), _omni().capabilities("m")
    )
    assert config.encoder_options == EncoderOptions(crf=28.0, preset="veryfast", keyframe_interval=8)
    assert config.ignored_fields == (
        "extra_params.video_codec_options.profile",
        "extra_params.video_codec_options.threads",
    )
    assert "video_codec_options" not in config.sampling["extra_params"] and config.sampling["extra_params"]["k"] == 1
    assert "encoder_options" not in config.to_json()
    params = engine_params(config, 33, {})
    assert "video_codec_options" not in params.extra_args and params.extra_args["k"] == 1
    # upstream's own default dict is taken as it is: its tune is ours, its threads ignored
    upstream = resolve_session_config(
        _start(extra_params={"video_codec_options": {"preset": "ultrafast", "threads": "0", "tune": "zerolatency"}}),
        _omni().capabilities("m"),
    )
    assert upstream.ignored_fields == ("extra_params.video_codec_options.threads",)
    # the built-in generator's encoder is not configured by them: the key is ignored whole
    builtin = resolve_session_config(
        _start(extra_params={"video_codec_options": options}), BackendSettings().capabilities("m")
    )
    assert builtin.ignored_fields == ("extra_params.video_codec_options",)


@pytest.mark.parametrize(
    "options,words",
    [
        ("fast", "must be an object of encoder option names to values"),
        ({"crf": 60}, "crf must be a number from 0 to 51, not 60"),
        ({"crf": "high"}, "crf must be a number from 0 to 51"),
        ({"preset": "placebo"}, "preset must be one of"),
        ({"g": 0}, "g (the keyframe interval) must be a whole number of frames"),
        ({"keyint": 2.5}, "keyint (the keyframe interval) must be a whole number"),
        ({"g": 4, "keyint": 8}, "g and keyint are both the keyframe interval"),
        ({"tune": "film"}, "tune 'film' is not supported"),
        ({"crf": True}, "crf must be a number"),
    ],
)
def test_a_bad_codec_option_refuses_the_start_by_name(options: Any, words: str) -> None:
    with pytest.raises(ProtocolError) as caught:
        resolve_session_config(_start(extra_params={"video_codec_options": options}), _omni().capabilities("m"))
    assert caught.value.code is ErrorCode.INVALID_START and words in str(caught.value.message)
    assert f"extra_params.{codec_options.VIDEO_CODEC_OPTIONS}" in str(caught.value.message)


def _encode(options: EncoderOptions | None, chunks: int = 2, frames: int = 20) -> tuple[bytes, list[int]]:
    encoder = FragmentedMp4Encoder(64, 64, 16, options=options)
    rng = np.random.default_rng(0)
    out = b"".join(
        encoder.encode_chunk(rng.integers(0, 255, (frames, 64, 64, 3), dtype=np.uint8)) for _ in range(chunks)
    )
    out += encoder.close()
    with av.open(io.BytesIO(out)) as container:
        keys = [i for i, frame in enumerate(container.decode(video=0)) if frame.key_frame]
    return out, keys


def test_the_encoder_applies_keyframe_interval_and_crf_and_stays_one_fragment_a_chunk() -> None:
    default, keys = _encode(None)
    assert keys == [0, 20]  # each chunk starts on a keyframe
    coarse, keys_coarse = _encode(EncoderOptions(crf=45))
    assert keys_coarse == [0, 20] and len(coarse) < len(default) / 2  # a higher CRF, far fewer bytes
    _, keys_dense = _encode(EncoderOptions(keyframe_interval=5))
    assert keys_dense == [0, 5, 10, 15, 20, 25, 30, 35]
    # still one moof + mdat per chunk (the per-chunk muxer must not cut at the extra keyframes)
    encoder = FragmentedMp4Encoder(64, 64, 16, options=EncoderOptions(keyframe_interval=5, preset="veryfast"))
    payload = encoder.encode_chunk(np.zeros((20, 64, 64, 3), np.uint8))
    second = encoder.encode_chunk(np.zeros((20, 64, 64, 3), np.uint8))
    assert payload.count(b"moof") == 1 and second.count(b"moof") == 1
