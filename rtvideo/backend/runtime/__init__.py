"""The session runtime: the manager admits sessions, each `Session` streams chunks from a `ChunkSource` (ports and sources name the seams)."""
