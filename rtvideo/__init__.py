"""Realtime text-to-video serving: a Triton Python-backend model and a WebSocket proxy in front of it."""
