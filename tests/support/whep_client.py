"""A WHEP client (RFC 9725) in Python: aiortc's RTCPeerConnection, receive-only, as OBS or a
player would be; it posts its offer over HTTP, takes the answer, and keeps the frames that
aiortc's own H.264 decoder makes of what it receives."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from aiortc import RTCPeerConnection, RTCRtpReceiver, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError
from tornado.httpclient import AsyncHTTPClient, HTTPRequest, HTTPResponse

WHEP_PATH = "/v1/realtime/video/whep"


async def post(base: str, body: bytes, headers: dict[str, str], query: str = "") -> HTTPResponse:
    """POST an offer to `base`'s WHEP door (`query`: e.g. `?token=…`, the deployment's)."""
    request = HTTPRequest(base + WHEP_PATH + query, method="POST", body=body, headers=headers, request_timeout=30)
    return await AsyncHTTPClient().fetch(request, raise_error=False)


async def delete(base: str, location: str) -> HTTPResponse:
    request = HTTPRequest(base + location, method="DELETE", request_timeout=30)
    return await AsyncHTTPClient().fetch(request, raise_error=False)


async def offer(codecs: str = "video/") -> tuple[RTCPeerConnection, str]:
    """A receive-only peer connection offering `codecs` (a MIME type prefix; by default every
    codec aiortc has, VP8 first, as a browser offers) and its offer SDP."""
    pc = RTCPeerConnection()
    transceiver = pc.addTransceiver("video", direction="recvonly")
    capabilities = RTCRtpReceiver.getCapabilities("video")
    assert capabilities is not None  # None only for a kind aiortc does not know
    wanted = [c for c in capabilities.codecs if c.mimeType.startswith(codecs)]
    transceiver.setCodecPreferences(wanted)
    await pc.setLocalDescription(await pc.createOffer())
    return pc, pc.localDescription.sdp


@dataclass
class Viewer:
    """One WHEP viewer: its peer connection, its resource, the frames it decoded (yuv420p planes
    stacked as PyAV's `to_ndarray` gives them) and each one's RTP time."""

    pc: RTCPeerConnection
    location: str
    frames: list[np.ndarray] = field(default_factory=list)
    times: list[int] = field(default_factory=list)
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    _reader: asyncio.Task[None] | None = None

    @classmethod
    async def open(cls, base: str, token: str) -> Viewer:
        pc, sdp = await offer()
        tracks: asyncio.Queue[Any] = asyncio.Queue()
        pc.on("track", tracks.put_nowait)
        response = await post(
            base, sdp.encode(), {"Authorization": f"Bearer {token}", "Content-Type": "application/sdp"}
        )
        if response.code != 201:
            await pc.close()
            raise AssertionError(f"WHEP POST answered {response.code}: {response.body!r}")
        assert response.headers["Content-Type"] == "application/sdp"
        await pc.setRemoteDescription(RTCSessionDescription(sdp=response.body.decode(), type="answer"))
        viewer = cls(pc, response.headers["Location"])
        track = await asyncio.wait_for(tracks.get(), 30)
        viewer._reader = asyncio.ensure_future(viewer._read(track))
        return viewer

    async def _read(self, track: Any) -> None:
        try:
            while True:
                frame = await track.recv()
                self.frames.append(frame.to_ndarray(format="yuv420p"))
                self.times.append(int(frame.pts))
        except MediaStreamError:
            pass
        finally:
            self.ended.set()

    async def until_frames(self, count: int, timeout: float = 60.0) -> None:
        async def wait() -> None:
            while len(self.frames) < count and not self.ended.is_set():
                await asyncio.sleep(0.05)

        await asyncio.wait_for(wait(), timeout)
        assert len(self.frames) >= count, f"the viewer ended after {len(self.frames)} frames"

    async def until_closed(self, timeout: float = 60.0) -> None:
        """Until the server closed the peer connection (the track ends; ICE goes)."""

        async def wait() -> None:
            while self.pc.connectionState not in ("closed", "failed", "disconnected"):
                await asyncio.sleep(0.05)

        await asyncio.wait_for(wait(), timeout)

    async def close(self) -> None:
        await self.pc.close()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    error = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if error == 0 else float(10 * np.log10(255.0**2 / error))
