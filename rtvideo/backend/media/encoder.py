"""Zero-lag fragmented MP4 (H.264) for Media Source Extensions.

A long-lived muxer either holds a chunk back until the next keyframe
(`frag_keyframe`) or holds one frame back (`frag_every_frame`). Instead, one
long-lived libx264 encoder feeds a fresh in-memory mp4 muxer per chunk: each
chunk becomes exactly one `moof`+`mdat` carrying exactly its frames, with
decode times continuing across chunks (`frag_discont`, `avoid_negative_ts`
disabled). Only the first payload keeps the init segment (`ftyp`+`moov`).
The per-chunk muxers cannot know the whole stream, so this module renumbers
the fragments and writes the closing `mfra` index itself.
"""

from __future__ import annotations

import io
import struct
from fractions import Fraction

import av
import numpy as np
from av.video.frame import PictureType
from av.video.reformatter import ColorRange, Colorspace, VideoReformatter

from rtvideo.core.codec_options import EncoderOptions
from rtvideo.core.fmp4 import FragmentIndex, boxes, fragment_header
from rtvideo.core.session_config import GeneratorLimits

_MUX_OPTIONS = {
    # skip_trailer: the per-chunk muxer's own mfra would index one fragment at wrong offsets.
    "movflags": "empty_moov+default_base_moof+frag_discont+skip_trailer+frag_custom",
    "avoid_negative_ts": "disabled",
}
_X264_OPTIONS = {
    "preset": "ultrafast",
    "tune": "zerolatency",  # no lookahead, no frame threads: one packet out per frame in
    "profile": "baseline",  # x264 baseline is Constrained Baseline: every MSE browser plays it
    "forced-idr": "1",  # a forced keyframe is an IDR, so every fragment decodes on its own
    "threads": "1",  # many sessions share the CPU; slice threads do not pay at these sizes
}
_BT709 = 1  # AVCOL_SPC / AVCOL_PRI / AVCOL_TRC value for ITU-R BT.709
_TV_RANGE = 1  # AVCOL_RANGE_MPEG
_DEFAULT_LIMITS = GeneratorLimits()


class FragmentedMp4Encoder:
    """RGB chunks in, one self-contained fMP4 fragment per chunk out, with zero frame lag."""

    def __init__(
        self,
        width: int,
        height: int,
        fps: int,
        limits: GeneratorLimits = _DEFAULT_LIMITS,
        options: EncoderOptions | None = None,
    ) -> None:
        """`options`: a start's `extra_params.video_codec_options` as they map onto this encoder
        (`rtvideo.core.codec_options`: CRF, preset, keyframe interval); None keeps its defaults."""
        problem = limits.size_problem(width, height) or limits.fps_problem(fps)
        if problem:
            raise ValueError(problem)
        self.width, self.height, self.fps = width, height, fps
        self.options = options or EncoderOptions()
        self.encoded_frames = 0
        self._time_base = Fraction(1, fps)
        self._codec = self._open_codec()
        self._reformatter = VideoReformatter()  # reusing its scaler context halves RGB->YUV cost
        self._init_segment = b""
        self._bytes_out = 0
        self._index = FragmentIndex()
        self._closed = False

    def _open_codec(self) -> av.VideoCodecContext:
        codec = av.CodecContext.create("libx264", "w")
        codec.width, codec.height = self.width, self.height
        codec.pix_fmt = "yuv420p"
        codec.time_base = self._time_base
        codec.framerate = Fraction(self.fps)
        codec.max_b_frames = 0
        codec.colorspace = codec.color_primaries = codec.color_trc = _BT709
        codec.color_range = _TV_RANGE
        options = dict(_X264_OPTIONS)
        if self.options.preset is not None:
            options["preset"] = self.options.preset
        if self.options.crf is not None:
            options["crf"] = f"{self.options.crf:g}"
        if self.options.keyframe_interval is not None:
            # keyframes inside a chunk too; each chunk's first frame is one whatever the interval
            codec.gop_size = self.options.keyframe_interval
        codec.options = options
        codec.open()
        return codec

    @property
    def init_segment(self) -> bytes:
        """`ftyp`+`moov` (empty until the first chunk): what a late joiner needs before any payload."""
        return self._init_segment

    def encode_chunk(self, frames: np.ndarray) -> bytes:
        """One payload holding exactly these frames (uint8 [N, H, W, 3] RGB, N >= 1)."""
        if self._closed:
            raise RuntimeError("encoder is closed")
        expected = (self.height, self.width, 3)
        if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[1:] != expected or not len(frames):
            raise ValueError(f"frames must be uint8 [N>=1, *{expected}], got {frames.dtype} {frames.shape}")
        packets = []
        for i, rgb in enumerate(np.ascontiguousarray(frames)):
            frame = self._reformatter.reformat(
                av.VideoFrame.from_ndarray(rgb, format="rgb24"),
                format="yuv420p",
                dst_colorspace=Colorspace.ITU709,
                dst_color_range=ColorRange.MPEG,
            )
            frame.pts = self.encoded_frames + i
            if i == 0:
                frame.pict_type = PictureType.I
            packets.extend(self._codec.encode(frame))
        if len(packets) != len(frames):
            raise RuntimeError(f"encoder returned {len(packets)} packets for {len(frames)} frames")
        self.encoded_frames += len(frames)
        payload = self._fragment(self._mux(packets))
        self._bytes_out += len(payload)
        return payload

    def _mux(self, packets: list[av.Packet]) -> bytes:
        buffer = io.BytesIO()
        with av.open(buffer, "w", format="mp4", options=_MUX_OPTIONS) as muxer:
            stream = muxer.add_mux_stream("h264", rate=self.fps, width=self.width, height=self.height)
            stream.time_base = self._time_base  # exact frame durations in the track timescale
            for packet in packets:
                packet.stream = stream
                muxer.mux(packet)
        return buffer.getvalue()

    def _fragment(self, muxed: bytes) -> bytes:
        """Keep the init segment once, renumber the fragment, and index it for the trailer."""
        laid = boxes(muxed)
        moofs = [box for box in laid if box.type == b"moof"]
        if len(moofs) != 1 or laid[-1].type != b"mdat":
            raise RuntimeError(f"unexpected muxer output: {[box.type for box in laid]}")
        moof = moofs[0]
        head = b"" if self._init_segment else muxed[: moof.start]
        fragment = bytearray(muxed[moof.start :])
        header = fragment_header(fragment)
        # Every fresh muxer numbers its fragment 1; sequence numbers should increase.
        struct.pack_into(">I", fragment, header.sequence_at, len(self._index.entries) + 1)
        self._index.track_id = header.track_id
        self._index.entries.append((header.decode_time, self._bytes_out + len(head)))

        if head:
            self._init_segment = head
        return head + bytes(fragment)

    def close(self) -> bytes:
        """The trailer: an `mfra` index of every fragment (b"" if no chunk was encoded)."""
        if self._closed:
            return b""
        self._closed = True
        leftover = self._codec.encode(None)
        if leftover:
            raise RuntimeError(f"encoder held back {len(leftover)} packets")
        return self._index.to_mfra() if self._index.entries else b""
