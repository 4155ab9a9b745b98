"""FragmentedMp4Encoder: zero-lag fMP4 payloads that PyAV decodes, alone and concatenated."""

from __future__ import annotations

import io
import struct

import av
import numpy as np
import pytest

from rtvideo.backend.media.encoder import FragmentedMp4Encoder

W, H, FPS = 128, 96, 16
CHUNK_SIZES = (9, 1, 9, 33)


def synthetic_frames(start: int, count: int, width: int = W, height: int = H) -> np.ndarray:
    """A moving colour gradient: cheap, smooth, and easy to compare after lossy coding."""
    t = np.arange(start, start + count)[:, None, None]
    x = np.arange(width)[None, None, :]
    y = np.arange(height)[None, :, None]
    r = (x * 2 + t * 3) % 256 + 0 * y
    g = (y * 2 + t * 2) % 256 + 0 * x
    b = np.broadcast_to(128 + 0 * t, r.shape)
    return np.stack(np.broadcast_arrays(r, g, b), axis=-1).astype(np.uint8)


def top_level_boxes(data: bytes) -> list[tuple[bytes, bytes]]:
    boxes, pos = [], 0
    while pos < len(data):
        size, kind = struct.unpack_from(">I4s", data, pos)
        boxes.append((kind, data[pos : pos + size]))
        pos += size
    return boxes


def decode(data: bytes, **options: str) -> list[av.VideoFrame]:
    with av.open(io.BytesIO(data), options=options) as container:
        return list(container.decode(video=0))


@pytest.fixture(scope="module")
def encoded() -> tuple[FragmentedMp4Encoder, list[np.ndarray], list[bytes], bytes]:
    encoder = FragmentedMp4Encoder(W, H, FPS)
    chunks, payloads, start = [], [], 0
    for size in CHUNK_SIZES:
        chunks.append(synthetic_frames(start, size))
        payloads.append(encoder.encode_chunk(chunks[-1]))
        start += size
    return encoder, chunks, payloads, encoder.close()


def test_concatenation_decodes_to_every_frame_at_the_right_size_and_speed(encoded) -> None:
    _, chunks, payloads, trailer = encoded
    total = sum(len(c) for c in chunks)
    for data in (b"".join(payloads), b"".join(payloads) + trailer):
        frames = decode(data)
        assert len(frames) == total
        assert {(f.width, f.height) for f in frames} == {(W, H)}
        # Continuous timestamps: frame i at i / FPS seconds.
        assert [round(float(f.time) * FPS) for f in frames] == list(range(total))


def test_decoded_pixels_match_the_input(encoded) -> None:
    _, chunks, payloads, _ = encoded
    decoded = np.stack([f.to_ndarray(format="rgb24") for f in decode(b"".join(payloads))])
    error = np.abs(decoded.astype(int) - np.concatenate(chunks).astype(int)).mean()
    assert error < 4, error  # also catches a BT.601/709 mismatch (~7)


def test_first_payload_has_the_init_segment_later_ones_one_fragment_each(encoded) -> None:
    encoder, _, payloads, _ = encoded
    first = [kind for kind, _ in top_level_boxes(payloads[0])]
    assert first == [b"ftyp", b"moov", b"moof", b"mdat"]
    assert payloads[0].startswith(encoder.init_segment)
    for payload in payloads[1:]:
        assert [kind for kind, _ in top_level_boxes(payload)] == [b"moof", b"mdat"]


def test_fragment_sequence_numbers_increase(encoded) -> None:
    _, _, payloads, _ = encoded
    numbers = []
    for payload in payloads:
        moof = dict(top_level_boxes(payload))[b"moof"]
        assert moof[12:16] == b"mfhd"
        numbers.append(struct.unpack_from(">I", moof, 20)[0])
    assert numbers == list(range(1, len(payloads) + 1))


def test_each_payload_alone_decodes_to_exactly_its_frames(encoded) -> None:
    encoder, chunks, payloads, _ = encoded
    for k, (chunk, payload) in enumerate(zip(chunks, payloads, strict=True)):
        body = payload if k == 0 else encoder.init_segment + payload
        frames = decode(body)
        assert len(frames) == len(chunk)
        assert frames[0].key_frame


def test_stream_is_constrained_baseline_h264(encoded) -> None:
    _, _, payloads, _ = encoded
    with av.open(io.BytesIO(payloads[0])) as container:
        codec = container.streams.video[0].codec_context
        assert codec.name == "h264"
        assert codec.profile == "Constrained Baseline"
        assert codec.extradata[1:3] == b"\x42\xc0"  # avcC: profile 66, constraint_set0+1 (avc1.42C0xx)


def test_trailer_is_an_mfra_index_that_the_demuxer_uses(encoded) -> None:
    _, chunks, payloads, trailer = encoded
    kinds = [kind for kind, _ in top_level_boxes(trailer)]
    assert kinds == [b"mfra"]
    assert trailer[-16:-12] == b"\x00\x00\x00\x10" and trailer[-12:-8] == b"mfro"
    assert struct.unpack(">I", trailer[-4:])[0] == len(trailer)
    assert struct.unpack_from(">I", trailer, 28)[0] == len(payloads)  # tfra: one entry per fragment

    total = sum(len(c) for c in chunks)
    media = b"".join(payloads)
    # With use_mfra_for the demuxer takes fragment times from our tfra entries ...
    frames = decode(media + trailer, use_mfra_for="dts")
    assert [round(float(f.time) * FPS) for f in frames] == list(range(total))
    # ... which it matches to fragments by offset: a wrong time shows up in the output.
    corrupt = bytearray(trailer)
    struct.pack_into(">Q", corrupt, 32 + 19, 10**7)  # second entry's time
    shifted = decode(media + bytes(corrupt), use_mfra_for="dts")
    assert [f.pts for f in shifted][len(chunks[0])] == 10**7


def test_encoded_frames_counts_and_close_is_final() -> None:
    encoder = FragmentedMp4Encoder(64, 32, FPS)
    assert encoder.close() == b""  # nothing encoded: no stream to index
    encoder = FragmentedMp4Encoder(64, 32, FPS)
    encoder.encode_chunk(synthetic_frames(0, 5, 64, 32))
    encoder.encode_chunk(synthetic_frames(5, 4, 64, 32))
    assert encoder.encoded_frames == 9
    trailer = encoder.close()
    assert [kind for kind, _ in top_level_boxes(trailer)] == [b"mfra"]
    assert struct.unpack_from(">I", trailer, 28)[0] == 2
    assert encoder.close() == b""
    with pytest.raises(RuntimeError):
        encoder.encode_chunk(synthetic_frames(9, 1, 64, 32))


@pytest.mark.parametrize("width, height", [(127, 96), (128, 95), (0, 96), (128, -2)])
def test_odd_or_empty_sizes_are_rejected(width: int, height: int) -> None:
    with pytest.raises(ValueError):
        FragmentedMp4Encoder(width, height, FPS)


@pytest.mark.parametrize(
    "frames",
    [
        np.zeros((0, H, W, 3), np.uint8),
        np.zeros((2, H, W, 3), np.float32),
        np.zeros((2, H + 2, W, 3), np.uint8),
        np.zeros((H, W, 3), np.uint8),
    ],
)
def test_wrong_frames_are_rejected(frames: np.ndarray) -> None:
    with pytest.raises(ValueError):
        FragmentedMp4Encoder(W, H, FPS).encode_chunk(frames)
