"""Unit tests of metrics, timing, tracing (rtvideo.proxy.observability)."""
