"""Interactions parsed once into typed parts (`types`), by one parser (`parse`), refused or not
by one function (`refusal`), applied by per-kind handlers (`registry`). Pure: the proxy, the
model and direct gRPC share it."""
