"""Tornado WebSocket proxy: `/v1/realtime/video` sessions onto Triton gRPC streams.

settings (flags/env) → app (routes, ProxyServer) → handler (admission, thin) → session
(one connection's protocol state) using bridge (Triton stream), outbox (writer, bound),
ordering (what may be written when), ledger (what the client got), access, metrics.
"""
