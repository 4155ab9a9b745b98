"""One stream continued by another (rtvideo.core.fmp4): what a decoder sees is one stream."""

from __future__ import annotations

import io
import struct

import av
import numpy as np
import pytest

from rtvideo.backend.media.encoder import FragmentedMp4Encoder
from rtvideo.core.fmp4 import Continuation, ContinuationError, FragmentCursor, boxes, child, fragment_header

W, H, FPS, PER_CHUNK, CHUNKS = 64, 48, 16, 9, 6


def _frames(chunk: int) -> np.ndarray:
    """A chunk of moving gradients: each frame differs, every run gives the same bytes."""
    t = np.arange(PER_CHUNK)[:, None, None, None] + chunk * PER_CHUNK
    y = np.arange(H)[None, :, None, None]
    x = np.arange(W)[None, None, :, None]
    c = np.arange(3)[None, None, None, :]
    return ((x * 3 + y * 2 + t * 7 + c * 40) % 256).astype(np.uint8)


def _decode(data: bytes) -> tuple[list[np.ndarray], list[int]]:
    with av.open(io.BytesIO(data), "r", format="mp4") as container:
        frames = list(container.decode(video=0))
    return [f.to_ndarray(format="rgb24") for f in frames], [round(float(f.time) * FPS) for f in frames]


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return 99.0 if mse == 0 else 10 * np.log10(255.0**2 / mse)


def _undisturbed() -> list[bytes]:
    encoder = FragmentedMp4Encoder(W, H, FPS)
    payloads = [encoder.encode_chunk(_frames(k)) for k in range(CHUNKS)]
    return [*payloads, encoder.close()]


@pytest.mark.parametrize("moved_at", [1, 3, 5])
def test_a_stream_continued_by_a_fresh_encoder_decodes_as_one(moved_at: int) -> None:
    whole = _undisturbed()
    cursor = FragmentCursor()
    sent = []
    for k in range(moved_at):
        cursor.media(whole[k], PER_CHUNK)
        sent.append(whole[k])
    fresh = FragmentedMp4Encoder(W, H, FPS)  # the session's chunks from `moved_at` on, on another Triton
    continuation = Continuation(cursor, FPS)
    for k in range(moved_at, CHUNKS):
        sent.append(continuation.media(fresh.encode_chunk(_frames(k)), PER_CHUNK))
    sent.append(continuation.trailer(fresh.close()))
    data = b"".join(sent)

    got, pts = _decode(data)
    want, _ = _decode(b"".join(whole))
    assert pts == list(range(CHUNKS * PER_CHUNK))  # decode times continue without a gap or a repeat
    assert min(_psnr(g, w) for g, w in zip(got, want, strict=True)) >= 35.0

    laid = boxes(data)
    assert [b.type for b in laid[:2]] == [b"ftyp", b"moov"]  # one init segment, first
    assert sum(b.type == b"moov" for b in laid) == 1
    moofs = [b for b in laid if b.type == b"moof"]
    assert [fragment_header(data[m.start : m.end]).sequence for m in moofs] == list(range(1, CHUNKS + 1))
    # the trailer indexes every fragment of the whole stream, at its offset and decode time
    mfra = laid[-1]
    assert mfra.type == b"mfra" and mfra.end == len(data)
    tfra = child(data, mfra, b"tfra")
    (count,) = struct.unpack_from(">I", data, tfra.start + 20)
    entries = [struct.unpack_from(">QQ", data, tfra.start + 24 + 19 * i) for i in range(count)]
    assert [offset for _, offset in entries] == [m.start for m in moofs]
    assert [t for t, _ in entries] == [fragment_header(data[m.start : m.end]).decode_time for m in moofs]


def test_a_second_move_continues_the_first() -> None:
    whole = _undisturbed()
    cursor = FragmentCursor()
    cursor.media(whole[0], PER_CHUNK)
    sent = [whole[0]]
    first = FragmentedMp4Encoder(W, H, FPS)
    moved = Continuation(cursor, FPS)
    sent += [moved.media(first.encode_chunk(_frames(k)), PER_CHUNK) for k in (1, 2)]
    second = FragmentedMp4Encoder(W, H, FPS)
    again = Continuation(cursor, FPS)
    sent += [again.media(second.encode_chunk(_frames(k)), PER_CHUNK) for k in range(3, CHUNKS)]
    sent.append(again.trailer(second.close()))
    _, pts = _decode(b"".join(sent))
    assert pts == list(range(CHUNKS * PER_CHUNK))


def test_what_cannot_be_continued_is_refused() -> None:
    with pytest.raises(ContinuationError, match="no init segment"):
        Continuation(FragmentCursor(), FPS)
    cursor = FragmentCursor()
    cursor.media(_undisturbed()[0], PER_CHUNK)
    other = FragmentedMp4Encoder(W * 2, H, FPS)  # another size: another init segment
    with pytest.raises(ContinuationError, match="init segment differs"):
        Continuation(cursor, FPS).media(other.encode_chunk(np.zeros((PER_CHUNK, H, W * 2, 3), np.uint8)), PER_CHUNK)
    with pytest.raises(ContinuationError):
        FragmentCursor().media(b"\x00\x00\x00\x04junk", 1)
