"""Unit tests of Tritons and streams (rtvideo.proxy.placement)."""
