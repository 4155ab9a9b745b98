"""Unit tests of what outlives a session's sockets: tokens, guest hubs, outboxes (rtvideo.proxy.participants)."""
