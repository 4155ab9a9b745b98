"""Unit tests of what a takeover writes and reads (rtvideo.proxy.continuity)."""
