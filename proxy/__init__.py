"""Tornado WebSocket proxy: `/v1/realtime/video` sessions onto Triton gRPC streams.

settings (flags/env) → app (routes, ProxyServer) → handler (admission, thin) → session
(one connection's protocol state), which writes through outbox (writer, bound) in the order
ordering allows, acks through acks, and keeps its events in one EventBook held by ledger
(what the client was handed); it reads from a streams.SessionStream: bridge (one Triton
server) or placement (many, with a supervisor each); plus access, limits, metrics, tasks.
"""
