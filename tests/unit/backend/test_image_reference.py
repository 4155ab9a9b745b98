"""A start's `image_reference`: decoded or fetched within bounds, refused with `invalid_start` otherwise,
and shown as the built-in generator's first frame (rtvideo/backend/media/image_reference.py).

Real PNG bytes (PyAV's encoder), a real HTTP server on loopback for the allowed-host case (the
test injects a resolver and an address check that admit it: the production default refuses
loopback, which `test_loopback_is_refused_by_default` checks with the real resolver).
"""

from __future__ import annotations

import base64
import contextlib
import http.server
import io
import itertools
import json
import threading
import time
from collections.abc import Iterator
from typing import Any, ClassVar

import av
import numpy as np
import pytest

from rtvideo.backend.builtin.generator import BuiltinGenerator
from rtvideo.backend.loading.settings import BackendSettings
from rtvideo.backend.media import image_reference
from rtvideo.backend.media.encoder import FragmentedMp4Encoder
from rtvideo.backend.media.image_reference import MediaPolicy, load_image_reference, public_address
from rtvideo.backend.runtime.manager import SessionManager
from rtvideo.backend.runtime.session import Limits
from rtvideo.backend.runtime.sources import GeneratorSources
from rtvideo.core.errors import ErrorCode, ProtocolError
from rtvideo.core.start_request import validate_start
from tests.support.recorder import Recorder
from tests.support.runtime_standins import SECRET


def png(image: np.ndarray) -> bytes:
    out = io.BytesIO()
    with av.open(out, "w", format="image2pipe") as container:
        stream = container.add_stream("png")
        stream.width, stream.height, stream.pix_fmt = image.shape[1], image.shape[0], "rgb24"
        for packet in stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb24")):
            container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return out.getvalue()


def data_url(data: bytes, kind: str = "image/png") -> str:
    return f"data:{kind};base64,{base64.b64encode(data).decode()}"


IMAGE = np.random.default_rng(7).integers(0, 256, (40, 60, 3), dtype=np.uint8)


def refused(url: str, policy: MediaPolicy | None = None) -> str:
    with pytest.raises(ProtocolError) as caught:
        load_image_reference(url, policy or MediaPolicy())
    assert caught.value.code is ErrorCode.INVALID_START
    return caught.value.message


# --- the start's shape (pure) ------------------------------------------------------------


def test_both_forms_of_vllm_omni_are_accepted() -> None:
    url = data_url(png(IMAGE))
    assert validate_start({"prompt": "p", "image_reference": {"image_url": url}}).image_reference == url
    assert validate_start({"prompt": "p", "image_reference": "https://a.example/x.png"}).image_reference == (
        "https://a.example/x.png"
    )
    assert validate_start({"prompt": "p"}).image_reference is None


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ([{"image_url": "https://a.example/x.png"}], "single image reference"),
        ({"file_id": "f"}, "file_id is not supported"),
        ({"image_url": 3}, "must be a string"),
        ({"url": "https://a.example/x.png"}, "image_url"),
        ("ftp://a.example/x.png", "data:image"),
        (7, "must be a string"),
    ],
)
def test_malformed_references_are_invalid_start(value: Any, fragment: str) -> None:
    with pytest.raises(ProtocolError, match=fragment) as caught:
        validate_start({"prompt": "p", "image_reference": value})
    assert caught.value.code is ErrorCode.INVALID_START


# --- data URLs ----------------------------------------------------------------------------


def test_a_png_data_url_is_decoded_exactly() -> None:
    assert np.array_equal(load_image_reference(data_url(png(IMAGE)), MediaPolicy()), IMAGE)
    wrapped = "data:image/png;base64," + base64.encodebytes(png(IMAGE)).decode()  # 76-column lines
    assert np.array_equal(load_image_reference(wrapped, MediaPolicy()), IMAGE)


def test_a_data_url_over_the_bound_is_refused_before_decoding() -> None:
    big = b"\x89PNG\r\n\x1a\n" + bytes(image_reference.MAX_IMAGE_BYTES)
    assert "larger than" in refused(data_url(big))


def test_undecodable_images_are_refused() -> None:
    assert "could not be decoded" in refused(data_url(b"\x89PNG\r\n\x1a\n" + b"garbage" * 40))
    assert "not a PNG, JPEG or WebP" in refused(data_url(b"GIF89a..."))
    assert "not valid base64" in refused("data:image/png;base64,@@@@")
    assert "data:image/png|jpeg|webp;base64" in refused("data:image/png," + "a" * 8)


def test_an_image_over_the_pixel_bound_is_refused() -> None:
    wide = np.zeros((2, image_reference.MAX_IMAGE_SIDE + 2, 3), dtype=np.uint8)
    assert "the limit is" in refused(data_url(png(wide)))


# --- remote URLs --------------------------------------------------------------------------


def test_no_allowed_domains_refuses_every_url_clearly() -> None:
    message = refused("https://images.example.com/a.png")
    assert "--allowed-media-domains" in message and "data:image" in message


def test_a_host_outside_the_allowed_domains_is_refused() -> None:
    policy = MediaPolicy(allowed_domains=("images.example.com",))
    assert "not among" in refused("https://evil.example.net/a.png", policy)
    assert "not among" in refused("https://images.example.com.evil.net/a.png", policy)


def test_a_host_that_resolves_to_a_private_address_is_refused() -> None:
    for address in ("10.1.2.3", "192.168.0.7", "169.254.169.254", "::1", "::ffff:127.0.0.1", "fd00::1"):
        policy = MediaPolicy(allowed_domains=(".example.com",), resolve=lambda host, port, a=address: [a])
        assert "non-public" in refused("https://img.example.com/a.png", policy), address
    # one bad address among good ones is enough to refuse (every address is checked)
    policy = MediaPolicy(allowed_domains=("img.example.com",), resolve=lambda host, port: ["93.184.216.34", "10.0.0.1"])
    assert "non-public" in refused("https://img.example.com/a.png", policy)


def test_loopback_is_refused_by_default() -> None:
    """The production resolver and address check: localhost is never fetched, even when allowed."""
    assert not public_address("127.0.0.1") and not public_address("::1") and public_address("93.184.216.34")
    assert "non-public" in refused("http://localhost:9/a.png", MediaPolicy(allowed_domains=("localhost",)))


class _ImageHandler(http.server.BaseHTTPRequestHandler):
    routes: ClassVar[dict[str, tuple[int, dict[str, str], bytes]]] = {}
    gate = threading.Event()  # "/gated" answers once a test sets it

    def do_GET(self) -> None:
        if self.path == "/slow":
            time.sleep(2.0)
        if self.path == "/gated":
            self.gate.wait(30)
        status, headers, body = self.routes.get(self.path, (404, {}, b"not found"))
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the client stopped reading (the size bound)
            self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    _ImageHandler.routes = {
        "/a.png": (200, {"Content-Type": "image/png"}, png(IMAGE)),
        "/moved": (302, {"Location": "http://images.test/a.png"}, b""),
        "/big": (200, {}, b"\x89PNG\r\n\x1a\n" + bytes(image_reference.MAX_IMAGE_BYTES)),
        "/slow": (200, {}, png(IMAGE)),
        "/gated": (200, {"Content-Type": "image/png"}, png(IMAGE)),
    }
    _ImageHandler.gate.clear()
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _ImageHandler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"images.test:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


def local_policy(**overrides: Any) -> MediaPolicy:
    """The allowed test host, resolved to the loopback server: only tests admit that address."""
    fields: dict[str, Any] = {
        "allowed_domains": ("images.test",),
        "resolve": lambda host, port: ["127.0.0.1"],
        "address_allowed": lambda address: True,
        "timeout_seconds": 1.0,
        **overrides,
    }
    return MediaPolicy(**fields)


def test_an_allowed_host_is_fetched(server: str) -> None:
    assert np.array_equal(load_image_reference(f"http://{server}/a.png", local_policy()), IMAGE)


def test_fetch_failures_are_invalid_start(server: str) -> None:
    policy = local_policy()
    assert "redirect" in refused(f"http://{server}/moved", policy)
    assert "HTTP 404" in refused(f"http://{server}/nothing", policy)
    assert "larger than" in refused(f"http://{server}/big", policy)
    assert "could not be downloaded" in refused(f"http://{server}/slow", policy)
    # the same server, with the production address check: loopback is refused before any connection
    assert "non-public" in refused(f"http://{server}/a.png", local_policy(address_allowed=public_address))


# --- the start, end to end in the model's session manager ---------------------------------


@pytest.fixture(scope="module")
def generator() -> BuiltinGenerator:
    return BuiltinGenerator(device="cpu", fps=16)


def start(generator: BuiltinGenerator, **fields: Any) -> Recorder:
    settings = BackendSettings(width=64, height=48, max_sessions=1)
    manager = SessionManager(
        sources=GeneratorSources(generator, FragmentedMp4Encoder),
        capabilities=settings.capabilities("realtime_video"),
        limits=Limits(pacing_lead_chunks=None, max_session_seconds=60.0, stall_timeout_seconds=60.0),
        max_sessions=1,
        media=settings.media_policy(),
    )
    channel = Recorder()
    payload = json.dumps({"type": "session.start", "prompt": "a red fire", "num_frames": 9, **fields}).encode()
    try:
        manager.on_request(1, payload, start=True, end=False, channel=channel, secret=SECRET)
        assert channel.finished.wait(30)
    finally:
        manager.shutdown()
    return channel


def test_a_bad_reference_refuses_the_start_before_video_start(generator: BuiltinGenerator) -> None:
    channel = start(generator, image_reference={"image_url": "https://images.example.com/a.png"})
    assert channel.types()[:2] == ["error", "session.done"]
    assert channel.sent[0][0]["code"] == "invalid_start"  # type: ignore[index]
    assert "--allowed-media-domains" in channel.sent[0][0]["message"]  # type: ignore[index]


def test_a_reference_starts_the_stream(generator: BuiltinGenerator) -> None:
    channel = start(generator, image_reference={"image_url": data_url(png(IMAGE))})
    assert channel.types()[0] == "video.start"
    assert "image_reference" not in json.dumps(channel.sent[0][0])  # the config says nothing new
    assert "video.chunk_metadata" in channel.types()


def test_the_first_frame_is_the_image_and_the_scene_takes_over(generator: BuiltinGenerator) -> None:
    size = dict(width=64, height=48, seed=3)
    with_image = generator.open_session(**size, image=IMAGE).generate({"a red fire": 1.0}, 9).astype(np.int16)
    plain = generator.open_session(**size).generate({"a red fire": 1.0}, 9).astype(np.int16)
    resized = image_reference.resize_image(IMAGE, 64, 48).astype(np.int16)
    assert np.abs(with_image[0] - resized).max() <= 1  # the image, at the session's size
    assert np.abs(with_image[-1] - plain[-1]).max() <= 1  # the scene, by the chunk's end
    distance_to_scene = [np.abs(with_image[k] - plain[k]).mean() for k in range(9)]
    assert all(a > b for a, b in itertools.pairwise(distance_to_scene))  # a steady hand-over


def test_a_remote_fetch_holds_only_its_own_sequence(generator: BuiltinGenerator, server: str) -> None:
    """The model handles requests on one thread: a start whose image is being downloaded must
    not hold other sessions' requests for the fetch (up to its timeout). Its own sequence's
    later requests wait for it, in order: a stop sent meanwhile stops the session it started."""
    from rtvideo.backend.runtime.dispatch import RequestDispatcher

    settings = BackendSettings(width=64, height=48, max_sessions=2)
    manager = SessionManager(
        sources=GeneratorSources(generator, FragmentedMp4Encoder),
        capabilities=settings.capabilities("realtime_video"),
        limits=Limits(pacing_lead_chunks=1.0, max_session_seconds=60.0, stall_timeout_seconds=60.0),
        max_sessions=2,
        media=local_policy(timeout_seconds=30.0),
    )
    dispatcher = RequestDispatcher(manager.on_request)
    manager.serve_on(dispatcher.call_soon)

    def start_payload(**fields: Any) -> bytes:
        return json.dumps({"type": "session.start", "prompt": "a red fire", **fields}).encode()

    fetching, other, stop_ack = Recorder(), Recorder(), Recorder()
    try:
        url = f"http://{server}/gated"
        dispatcher.submit(
            1, start_payload(image_reference={"image_url": url}), start=True, end=False, channel=fetching, secret=SECRET
        )
        dispatcher.submit(1, b'{"type":"session.stop"}', start=False, end=True, channel=stop_ack, secret=SECRET)
        dispatcher.submit(2, start_payload(num_frames=9), start=True, end=False, channel=other, secret=SECRET)
        assert other.finished.wait(30), other.types()  # the other session ran to its end meanwhile
        assert other.types()[0] == "video.start" and "session.done" in other.types()
        assert fetching.sent == [] and stop_ack.sent == []  # still fetching: nothing answered yet
        _ImageHandler.gate.set()
        assert fetching.finished.wait(30) and stop_ack.finished.wait(30)
        assert fetching.types()[0] == "video.start"
        done = next(m for m, _, _ in fetching.sent if m and m["type"] == "session.done")
        assert done["stopped"] is True  # the stop that waited for the start stopped it
    finally:
        _ImageHandler.gate.set()
        dispatcher.close()
        manager.shutdown()
