"""Tornado WebSocket proxy: `/v1/realtime/video` sessions onto Triton gRPC streams.

Rooms by flow (docs/architecture.md "The proxy's rooms"): `edge` (sockets, doors, HTTP
routes, access) → `session` (one session: phase, steering, Triton stream, replies in order,
ending) with `participants` (owner, watchers, steerers and the tokens that attach them) →
`placement` (the Tritons, supervision, moves); `recordings` and `observability` beside;
`app` composes them, `settings` declares every flag once.
"""
