"""Where sessions run: the pool of Tritons, one endpoint each with its supervision and
heartbeat, the gRPC bridge, and moves of a live session between Tritons."""
