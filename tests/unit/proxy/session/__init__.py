"""Unit tests of one session's parts (rtvideo.proxy.session)."""
