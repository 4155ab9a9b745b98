"""The proxy's one dependency on Tornado internals (`proxy/handler.py`, `_StrictTextProtocol`):
every name it uses, read in the installed Tornado, so a release that changes them fails here
instead of silently turning a bad text frame back into a dropped connection."""

from __future__ import annotations

import inspect

import tornado
from tornado.websocket import WebSocketHandler, WebSocketProtocol13

from rtvideo.proxy.handler import _StrictTextProtocol


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


def test_the_protocol_tornado_builds_is_the_one_swapped() -> None:
    source = inspect.getsource(WebSocketHandler.get_websocket_protocol)
    assert "WebSocketProtocol13(" in source
    assert _StrictTextProtocol.__mro__[1] is WebSocketProtocol13
    added = {name for name in vars(_StrictTextProtocol) if not name.startswith("__") and name != "_abc_impl"}
    assert added == {"_handle_message"}  # no state of its own: swapping a built protocol's class is safe
