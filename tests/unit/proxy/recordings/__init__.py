"""Unit tests of recordings (rtvideo.proxy.recordings)."""
