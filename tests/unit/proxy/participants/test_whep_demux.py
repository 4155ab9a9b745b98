"""The WHEP viewer's passthrough: the encoder's fMP4 payloads → Annex-B access units that a
plain H.264 decoder decodes to the very frames the MP4 holds, timed as the fragments say;
and the offers the door refuses before the WebRTC stack sees them."""

from __future__ import annotations

import io

import av
import numpy as np
import pytest

from rtvideo.backend.media.encoder import FragmentedMp4Encoder
from rtvideo.core.fmp4 import ContinuationError
from rtvideo.proxy.participants.whep_viewer import RTP_CLOCK, Demuxer, OfferError, check_offer
from tests.unit.backend.test_encoder import synthetic_frames

W, H, FPS = 128, 96, 16
CHUNKS = (9, 9, 1, 9)


def _payloads() -> list[bytes]:
    encoder = FragmentedMp4Encoder(W, H, FPS)
    out, start = [], 0
    for size in CHUNKS:
        out.append(encoder.encode_chunk(synthetic_frames(start, size)))
        start += size
    encoder.close()
    return out


def _mp4_frames(data: bytes) -> list[np.ndarray]:
    with av.open(io.BytesIO(data)) as container:
        return [f.to_ndarray(format="yuv420p") for f in container.decode(video=0)]


def _annexb_frames(units: list[bytes]) -> list[np.ndarray]:
    codec = av.CodecContext.create("h264", "r")
    frames = []
    for unit in units:
        for frame in codec.decode(av.Packet(unit)):
            frames.append(frame.to_ndarray(format="yuv420p"))
    for frame in codec.decode(None):
        frames.append(frame.to_ndarray(format="yuv420p"))
    return frames


def test_access_units_decode_to_the_mp4s_frames_with_its_times() -> None:
    payloads = _payloads()
    demuxer = Demuxer()
    units = [u for p in payloads for u in demuxer.payload(p)]
    assert len(units) == sum(CHUNKS)
    assert [u.pts for u in units] == [i * RTP_CLOCK // FPS for i in range(sum(CHUNKS))]
    starts = {0, 9, 18, 19}
    assert [i for i, u in enumerate(units) if u.keyframe] == sorted(starts)
    assert all(u.data.startswith(b"\x00\x00\x00\x01") for u in units)
    decoded = _annexb_frames([u.data for u in units])
    expected = _mp4_frames(b"".join(payloads))
    assert len(decoded) == len(expected) == sum(CHUNKS)
    for got, want in zip(decoded, expected, strict=True):
        np.testing.assert_array_equal(got, want)  # passed through: bit-exact, not re-encoded


def test_a_viewer_that_joins_late_starts_at_the_next_fragment_with_the_init_pair() -> None:
    payloads = _payloads()
    init_end = payloads[0].index(b"moof") - 4
    demuxer = Demuxer()
    assert demuxer.payload(payloads[1]) == []  # no init segment yet: nothing to decode with
    assert demuxer.payload(payloads[0][:init_end]) == []  # the init pair: parameter sets only
    units = demuxer.payload(payloads[2])
    assert units[0].keyframe and units[0].pts == 18 * RTP_CLOCK // FPS
    assert len(_annexb_frames([u.data for u in units])) == 1


def test_bad_bytes_are_a_continuation_error() -> None:
    payload = _payloads()[0]
    with pytest.raises(ContinuationError):
        Demuxer().payload(payload[:-10])
    with pytest.raises(ContinuationError):
        Demuxer().payload(b"\x00\x00\x00\x10moov" + b"\x00" * 8)


OFFER = "v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\nm=video 9 UDP/TLS/RTP/SAVPF 96 97\r\n"


@pytest.mark.parametrize(
    ("sdp", "status"),
    [
        ("", 400),
        ("hello", 400),
        ("v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\na=rtpmap:111 opus/48000/2\r\n", 400),
        (OFFER + "a=rtpmap:96 VP8/90000\r\n", 406),
        (OFFER + "a=rtpmap:96 VP8/90000\r\nbroken line\r\n", 400),
    ],
)
def test_offers_without_video_or_h264_are_refused(sdp: str, status: int) -> None:
    with pytest.raises(OfferError) as refused:
        check_offer(sdp)
    assert refused.value.status == status


def test_an_offer_with_h264_passes() -> None:
    check_offer(OFFER + "a=rtpmap:96 VP8/90000\r\na=rtpmap:97 H264/90000\r\n")


def test_ice_servers_are_stun_or_turn_urls_without_credentials() -> None:
    from rtvideo.proxy.settings import ProxySettings

    ok = ("stun:stun.example.net:3478", "turn:turn.example.net:3478?transport=tcp", "turns:t.example.net")
    assert ProxySettings(ice_servers=ok).ice_servers == ok
    for bad in ("http://stun.example.net", "turn:user:secret@turn.example.net", "stun:", "turn:x?transport=sctp"):
        with pytest.raises(ValueError, match="ice_server"):
            ProxySettings(ice_servers=(bad,))
