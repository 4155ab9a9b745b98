"""The proxy's one dependency on Tornado internals (`proxy/edge/socket.py`, `_StrictTextProtocol`):
every name it uses, read in the installed Tornado, so a release that changes them fails here
instead of silently turning a bad text frame back into a dropped connection."""

from __future__ import annotations

import inspect
from unittest import mock

import tornado
from tornado.httputil import HTTPHeaders, HTTPServerRequest, RequestStartLine
from tornado.web import Application
from tornado.websocket import WebSocketHandler, WebSocketProtocol13

from rtvideo.proxy.edge.socket import RealtimeVideoHandler, _StrictTextProtocol


def test_the_pinned_major_version_is_the_one_installed() -> None:
    assert tornado.version_info[0] == 6


def test_handle_message_takes_the_frame_before_decoding_it() -> None:
    method = WebSocketProtocol13._handle_message
    assert list(inspect.signature(method).parameters) == ["self", "opcode", "data"]
    source = inspect.getsource(method)
    # what the override replaces: Tornado decodes a text frame and aborts the connection on failure
    assert 'data.decode("utf-8")' in source and "self._abort()" in source
    assert "self._frame_compressed" in source  # a compressed frame's bytes are inflated first


def test_the_attributes_the_override_reads_exist() -> None:
    init = inspect.getsource(WebSocketProtocol13.__init__) + inspect.getsource(WebSocketProtocol13.__mro__[1].__init__)
    assert "self.client_terminated" in init and "self.handler" in init
    assert "self._frame_compressed" in inspect.getsource(WebSocketProtocol13._receive_frame)


def test_the_protocol_is_built_with_the_parameters_tornado_chose() -> None:
    source = inspect.getsource(WebSocketHandler.get_websocket_protocol)
    assert "WebSocketProtocol13(self, False, params)" in source
    assert list(inspect.signature(WebSocketProtocol13.__init__).parameters) == [
        "self",
        "handler",
        "mask_outgoing",
        "params",
    ]
    assert _StrictTextProtocol.__mro__[1] is WebSocketProtocol13
    added = {name for name in vars(_StrictTextProtocol) if not name.startswith("__") and name != "_abc_impl"}
    assert added == {"_handle_message"}

    protocol = _handler().get_websocket_protocol()
    assert type(protocol) is _StrictTextProtocol
    assert protocol.mask_outgoing is False  # a server never masks
    assert (protocol.params.max_message_size, protocol.params.ping_interval) == (1234, 7)


def test_a_bad_text_frame_goes_to_the_handler_and_others_take_tornados_path() -> None:
    handler = _handler()
    protocol = handler.get_websocket_protocol()
    assert protocol is not None
    seen: list[object] = []
    handler.on_invalid_text = lambda: seen.append("invalid")
    handler.on_message = seen.append

    assert protocol._handle_message(0x1, b"\xff\xfe") is None
    protocol._handle_message(0x1, "é".encode())
    protocol._handle_message(0x2, b"\xff")
    assert seen == ["invalid", "é", b"\xff"]
    assert not protocol.client_terminated  # the handler closes with 1007; nothing aborted the stream


def _handler() -> RealtimeVideoHandler:
    """A handler as Tornado builds it for an upgrade request, before the upgrade runs."""
    app = Application(websocket_max_message_size=1234, websocket_ping_interval=7)
    request = HTTPServerRequest(
        start_line=RequestStartLine("GET", "/v1/realtime/video", "HTTP/1.1"),
        headers=HTTPHeaders({"Host": "localhost", "Sec-WebSocket-Version": "13"}),
        connection=mock.Mock(),
    )
    return RealtimeVideoHandler(app, request, context=mock.Mock())
