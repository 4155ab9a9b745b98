"""Unit tests of HLS broadcasts (rtvideo.proxy.broadcasts)."""
