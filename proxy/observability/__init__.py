"""What an operator reads: Prometheus metrics, the access log, OpenTelemetry traces, each
session's clocks, and the in-band `session.metrics`."""
