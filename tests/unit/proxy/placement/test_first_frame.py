"""The frame an approximate start begins from (rtvideo.proxy.placement.first_frame): the last frame of a
fragment, found by position in a whole stream, decoded with the init segment, as a data URL the
model's image_reference reader takes back to the same pixels; bad bytes are `NoFrame`."""

from __future__ import annotations

import io

import numpy as np
import pytest

from rtvideo.backend.media.encoder import FragmentedMp4Encoder
from rtvideo.backend.media.image_reference import MediaPolicy, load_image_reference
from rtvideo.proxy.placement import first_frame

W, H = 64, 48


def chunk(level: int) -> np.ndarray:
    ramp = np.linspace(0, 60, W)[None, None, :, None]  # [1, 1, W, 1]
    steps = np.arange(3)[:, None, None, None] * 10  # [frames, 1, 1, 1]: each frame brighter
    frames = np.broadcast_to(ramp + level + steps, (3, H, W, 3))
    return np.clip(frames, 0, 255).astype(np.uint8)


@pytest.fixture(scope="module")
def video() -> tuple[bytes, list[np.ndarray]]:
    encoder = FragmentedMp4Encoder(W, H, 16)
    chunks = [chunk(40 * i) for i in range(3)]
    return b"".join(encoder.encode_chunk(c) for c in chunks) + encoder.close(), chunks


def test_each_fragments_last_frame_round_trips_through_the_url(video) -> None:
    data, chunks = video
    for position, frames in enumerate(chunks):
        rgb = first_frame.last_frame(*first_frame.fragment_of(io.BytesIO(data), position))
        assert rgb.shape == (H, W, 3) and np.abs(rgb.astype(int) - frames[-1]).max() <= 3
        url = first_frame.image_url(rgb)
        assert url.startswith("data:image/png;base64,")
        assert np.array_equal(np.asarray(load_image_reference(url, MediaPolicy())), rgb)  # lossless


def test_a_frame_over_the_png_limit_goes_as_jpeg() -> None:
    noise = np.random.default_rng(1).integers(0, 256, (1080, 1920, 3), dtype=np.uint8)
    url = first_frame.image_url(noise)
    assert url.startswith("data:image/jpeg;base64,") and len(url) <= first_frame.MAX_URL_BYTES


def test_bad_bytes_are_no_frame(video) -> None:
    data, _ = video
    with pytest.raises(first_frame.NoFrame, match="3 fragments, not 4"):
        first_frame.fragment_of(io.BytesIO(data), 3)
    with pytest.raises(first_frame.NoFrame, match="no fMP4"):
        first_frame.fragment_of(io.BytesIO(b"\x00\x00\x00\x04junk"), 0)
    _, last = first_frame.fragment_of(io.BytesIO(data), 2)
    with pytest.raises(first_frame.NoFrame, match="cut short"):  # a recording cut in its last fragment
        first_frame.fragment_of(io.BytesIO(data[: data.index(last) + len(last) - 10]), 2)
    init, fragment = first_frame.fragment_of(io.BytesIO(data), 1)
    with pytest.raises(first_frame.NoFrame, match="does not decode"):
        first_frame.last_frame(init, fragment[: len(fragment) // 2])
    with pytest.raises(first_frame.NoFrame):
        first_frame.last_frame(b"", b"not a video")
