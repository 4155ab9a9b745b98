"""Unit tests of the proxy's doors (rtvideo.proxy.edge)."""
