"""A start's `image_reference`: the image behind its URL, decoded, within bounds (docs/protocol.md §2.1).

The backend resolves it, so a client on the proxy and one on Triton's gRPC meet the same rules,
configured in one place (`BackendSettings`: `allowed_media_domains`, `media_fetch_timeout_seconds`):

* `data:image/png|jpeg|webp;base64,...`: decoded here; at most `MAX_IMAGE_BYTES` encoded.
* `http(s)://HOST/...`: fetched only when HOST is one of the deployer's allowed domains (none by
  default, like vLLM's `--allowed-media-domains`), never from a loopback, private, link-local or
  otherwise non-public address: every address the name resolves to is checked, and the
  connection goes to the checked address (a second lookup cannot swap it). No redirects; a
  timeout and `MAX_IMAGE_BYTES` bound the download.

The image must be PNG, JPEG or WebP with at most `MAX_IMAGE_SIDE` pixels a side and
`MAX_IMAGE_PIXELS` in all (checked from its header before it is decoded). Every failure is
`invalid_start` with a sentence saying why; nothing here is retried.
"""

from __future__ import annotations

import base64
import binascii
import http.client
import io
import ipaddress
import socket
import ssl
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if (
    TYPE_CHECKING
):  # numpy is imported where an image is decoded: `rtvideo record` (a client install) reads MediaPolicy's settings
    import numpy as np

from rtvideo.core.errors import ErrorCode, ProtocolError

#: an image's encoded size, from a data URL or a download (a data URL's base64 also fits the start's 4 MiB)
MAX_IMAGE_BYTES = 3 * 1024 * 1024
#: an image's sides and pixel count: decoding stays in the tens of milliseconds
MAX_IMAGE_SIDE = 4096
MAX_IMAGE_PIXELS = 4096 * 2304
DEFAULT_FETCH_TIMEOUT_SECONDS = 3.0
#: the formats PyAV's image demuxers read, by their leading bytes
_MAGIC = {b"\x89PNG\r\n\x1a\n": "png", b"\xff\xd8\xff": "jpeg", b"RIFF": "webp"}
_DATA_TYPES = {"image/png", "image/jpeg", "image/jpg", "image/webp"}

Resolver = Callable[[str, int], Sequence[str]]


def public_address(address: str) -> bool:
    """Whether a fetch may go to `address`: a globally routable unicast address, never a
    loopback, private, link-local, multicast, reserved or unspecified one (IPv4-mapped IPv6
    is judged as the IPv4 address it maps)."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


def system_resolver(host: str, port: int) -> list[str]:
    """Every address `host` resolves to (the system resolver)."""
    return sorted({str(info[4][0]) for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)})


@dataclass(frozen=True)
class MediaPolicy:
    """Where remote images may come from, and how long fetching one may take.

    `allowed_domains`: host names (exact, case-insensitive) or `.example.com` (any subdomain of it);
    empty refuses every remote URL. `resolve` and `address_allowed` are seams for tests: the
    production defaults resolve with the system and refuse every non-public address."""

    allowed_domains: tuple[str, ...] = ()
    timeout_seconds: float = DEFAULT_FETCH_TIMEOUT_SECONDS
    max_bytes: int = MAX_IMAGE_BYTES
    resolve: Resolver = field(default=system_resolver, compare=False)
    address_allowed: Callable[[str], bool] = field(default=public_address, compare=False)

    def host_allowed(self, host: str) -> bool:
        host = host.lower().rstrip(".")
        for domain in self.allowed_domains:
            domain = domain.lower().rstrip(".")
            if domain.startswith(".") and (host.endswith(domain) or host == domain[1:]):
                return True
            if host == domain:
                return True
        return False


def _refuse(message: str) -> ProtocolError:
    return ProtocolError(ErrorCode.INVALID_START, message)


def load_image_reference(url: str, policy: MediaPolicy) -> np.ndarray:
    """The image at `url` (a data URL or an allowed http(s) URL) as uint8 RGB [H, W, 3]."""
    if url.startswith("data:"):
        return decode_image(_data_url_bytes(url, policy.max_bytes), "image_reference")
    if url.startswith(("http://", "https://")):
        return decode_image(fetch(url, policy), "image_reference")
    raise _refuse("image_reference must be a data:image/... URL or an http(s) URL")


def _data_url_bytes(url: str, max_bytes: int) -> bytes:
    head, sep, payload = url.partition(",")
    if not sep:
        raise _refuse("image_reference data URL has no ',' before its data")
    parts = head[len("data:") :].split(";")
    if parts[0].lower() not in _DATA_TYPES or "base64" not in parts[1:]:
        raise _refuse("image_reference data URL must be data:image/png|jpeg|webp;base64,...")
    payload = "".join(payload.split())  # line breaks (base64 wrapped at 76 columns) are allowed
    if len(payload) > (max_bytes + 2) // 3 * 4 + 4:
        raise _refuse(f"image_reference is larger than {max_bytes} bytes")
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise _refuse("image_reference data URL is not valid base64") from None
    if len(data) > max_bytes:
        raise _refuse(f"image_reference is larger than {max_bytes} bytes")
    return data


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    """HTTPS to a checked address, with the URL's host name for SNI and the certificate."""

    def __init__(self, host: str, address: str, port: int, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout, context=ssl.create_default_context())
        self._address = address

    def connect(self) -> None:
        sock = socket.create_connection((self._address, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)  # type: ignore[attr-defined]


class _PinnedHTTPConnection(http.client.HTTPConnection):
    def __init__(self, host: str, address: str, port: int, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self._address = address

    def connect(self) -> None:
        self.sock = socket.create_connection((self._address, self.port), self.timeout)


def fetch(url: str, policy: MediaPolicy) -> bytes:
    """GET `url` under `policy`: an allowed host, public addresses only, no redirects, bounded."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname
    if parts.scheme not in ("http", "https") or not host:
        raise _refuse("image_reference must be an http(s) URL with a host")
    if not policy.allowed_domains:
        raise _refuse(
            "image_reference URLs are not fetched by this server (no allowed media domains: "
            "the deployer sets --allowed-media-domains); send the image as a data:image/...;base64 URL"
        )
    if not policy.host_allowed(host):
        raise _refuse(f"image_reference host {host!r} is not among this server's allowed media domains")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        addresses = list(policy.resolve(host, port))
    except (OSError, UnicodeError) as exc:
        raise _refuse(f"image_reference host {host!r} could not be resolved: {exc}") from None
    if not addresses:
        raise _refuse(f"image_reference host {host!r} has no address")
    refused = [a for a in addresses if not policy.address_allowed(a)]
    if refused:
        raise _refuse(
            f"image_reference host {host!r} resolves to a loopback, private or otherwise non-public "
            f"address ({refused[0]}); such addresses are never fetched"
        )
    path = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
    connection_type = _PinnedHTTPSConnection if parts.scheme == "https" else _PinnedHTTPConnection
    connection = connection_type(host, addresses[0], port, policy.timeout_seconds)
    try:
        connection.request(
            "GET", path, headers={"Accept": "image/png, image/jpeg, image/webp", "User-Agent": "rtvideo"}
        )
        response = connection.getresponse()
        if 300 <= response.status < 400:
            raise _refuse(
                f"image_reference URL answered a redirect (HTTP {response.status}); redirects are not followed"
            )
        if response.status != 200:
            raise _refuse(f"image_reference URL answered HTTP {response.status}")
        length = response.getheader("Content-Length")
        if length is not None and length.isdigit() and int(length) > policy.max_bytes:
            raise _refuse(f"image_reference is larger than {policy.max_bytes} bytes")
        data = response.read(policy.max_bytes + 1)
    except (OSError, http.client.HTTPException) as exc:  # timeouts are OSErrors
        raise _refuse(f"image_reference could not be downloaded: {type(exc).__name__}: {exc}") from None
    finally:
        connection.close()
    if len(data) > policy.max_bytes:
        raise _refuse(f"image_reference is larger than {policy.max_bytes} bytes")
    return data


def decode_image(data: bytes, name: str) -> np.ndarray:
    """PNG, JPEG or WebP bytes to uint8 RGB [H, W, 3]; the size is checked from the header first."""
    import av  # the encoder's library: its image demuxers read the three formats
    import numpy as np

    kind = next((fmt for magic, fmt in _MAGIC.items() if data.startswith(magic)), None)
    if kind is None or (kind == "webp" and data[8:12] != b"WEBP"):
        raise _refuse(f"{name} is not a PNG, JPEG or WebP image")
    try:
        with av.open(io.BytesIO(data), mode="r", format=f"{kind}_pipe") as container:
            stream = container.streams.video[0]
            width, height = stream.codec_context.width, stream.codec_context.height
            if width and height and (max(width, height) > MAX_IMAGE_SIDE or width * height > MAX_IMAGE_PIXELS):
                raise _refuse(
                    f"{name} is {width}x{height}; the limit is {MAX_IMAGE_SIDE} pixels a side and {MAX_IMAGE_PIXELS} in all"
                )
            for frame in container.decode(stream):
                if max(frame.width, frame.height) > MAX_IMAGE_SIDE or frame.width * frame.height > MAX_IMAGE_PIXELS:
                    raise _refuse(f"{name} is {frame.width}x{frame.height}; the limit is {MAX_IMAGE_SIDE} a side")
                return np.ascontiguousarray(frame.to_ndarray(format="rgb24"))
    except ProtocolError:
        raise
    except Exception as exc:  # noqa: BLE001 - PyAV raises many types for broken data
        raise _refuse(f"{name} could not be decoded: {type(exc).__name__}") from None
    raise _refuse(f"{name} holds no image")


def resize_image(image: np.ndarray, width: int, height: int) -> np.ndarray:
    """uint8 RGB [H, W, 3] scaled to `width` x `height` (libswscale's bicubic), aspect not kept:
    the reference is the first frame, whatever the session's size."""
    import av
    import numpy as np

    if image.shape[1] == width and image.shape[0] == height:
        return image

    frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb24")
    return np.ascontiguousarray(frame.reformat(width=width, height=height, format="rgb24").to_ndarray())
