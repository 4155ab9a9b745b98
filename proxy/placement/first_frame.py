"""The frame an approximate start begins from (rtvideo.core.approximation): the last frame of an
fMP4 fragment the viewer was sent, as an `image_reference` data URL.

Every fragment our encoder writes starts with an IDR frame (rtvideo.backend.media.encoder), so the
init segment and that one fragment decode on their own. The image is PNG (lossless: the new
session starts from exactly what the viewer saw), or JPEG (`qscale` 2, about quality 95) when
the PNG would be over the model's image limit (rtvideo.backend.media.image_reference.MAX_IMAGE_BYTES,
base64 counted).

Blocking (PyAV): call it in an executor where the event loop must not wait.
"""

from __future__ import annotations

import base64
import io
import struct
from typing import IO, cast

import av
import numpy as np
from av.video.codeccontext import VideoCodecContext

#: the model's bound on an image_reference, as sent (rtvideo.backend.media.image_reference.MAX_IMAGE_BYTES)
MAX_URL_BYTES = 3 * 1024 * 1024


class NoFrame(ValueError):
    """The bytes hold no decodable frame; the message says why."""


def last_frame(init: bytes, fragment: bytes) -> np.ndarray:
    """The last frame of `fragment` (decoded with `init`), uint8 RGB [H, W, 3]."""
    frame = None
    try:
        with av.open(io.BytesIO(init + fragment), mode="r", format="mp4") as container:
            for decoded in container.decode(video=0):
                frame = decoded
    except (av.FFmpegError, ValueError) as exc:
        raise NoFrame(f"the fragment does not decode: {exc}") from None
    if frame is None:
        raise NoFrame("the fragment holds no frame")
    return np.asarray(frame.to_ndarray(format="rgb24"))


def fragment_of(video: IO[bytes], position: int) -> tuple[bytes, bytes]:
    """The init segment of a whole fMP4 stream (a recording's `video.mp4`, open and seekable) and
    its fragment number `position` (0: the first media payload's). Reads box headers up to it,
    then only the init segment and that fragment: a recording may be gigabytes."""
    init = b""
    moof: tuple[int, int] | None = None  # (offset, size) of the fragment's moof
    found = offset = 0
    while True:
        video.seek(offset)
        head = video.read(8)
        if len(head) < 8:
            raise NoFrame(f"the stream has {found} fragments, not {position + 1}")
        size, kind = struct.unpack(">I4s", head)
        if size < 8:
            raise NoFrame(f"the stream is no fMP4: malformed box {kind!r} at {offset}")
        if kind == b"moof":
            if not init:
                video.seek(0)
                init = video.read(offset)
            moof = (offset, size)
        elif kind == b"mdat" and moof is not None:
            if found == position:
                video.seek(moof[0])
                fragment = video.read(offset + size - moof[0])
                if len(fragment) < offset + size - moof[0]:
                    raise NoFrame(f"fragment {position} is cut short")
                return init, fragment
            found += 1
            moof = None
        offset += size


def image_url(rgb: np.ndarray) -> str:
    """`rgb` as a data URL the model takes as `image_reference`."""
    # zlib level 1: a quarter of the default's time at 1280x704 (~12 ms), the file ~1.7x larger
    png, jpeg = {"compression_level": "1"}, {"qscale": "2"}
    for codec, mime, options in (("png", "image/png", png), ("mjpeg", "image/jpeg", jpeg)):
        encoded = _encode(rgb, codec, options)
        url = f"data:{mime};base64," + base64.b64encode(encoded).decode("ascii")
        if len(url) <= MAX_URL_BYTES:
            return url
    raise NoFrame(f"a {rgb.shape[1]}x{rgb.shape[0]} frame is over the image limit even as JPEG")


def _encode(rgb: np.ndarray, codec: str, options: dict[str, str]) -> bytes:
    context = cast(VideoCodecContext, av.CodecContext.create(codec, "w"))
    context.width, context.height = rgb.shape[1], rgb.shape[0]
    frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")
    if codec == "png":
        context.pix_fmt = "rgb24"
    else:
        context.pix_fmt = "yuvj444p"
        frame = frame.reformat(format="yuvj444p")
    context.options = options
    return b"".join(bytes(packet) for packet in (*context.encode(frame), *context.encode(None)))
