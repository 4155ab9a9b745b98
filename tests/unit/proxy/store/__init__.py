"""Unit tests of the session store (rtvideo.proxy.store)."""
