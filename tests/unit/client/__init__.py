"""Unit tests of the Python client (rtvideo.client)."""
