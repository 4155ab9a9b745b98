"""Unit tests of the base modules: settings, limits (rtvideo.proxy.settings, rtvideo.proxy.limits)."""
