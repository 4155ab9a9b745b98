"""Server-side recordings of sessions (docs/recordings.md): the stream exactly as sent, an
event log of every JSON message in and out, and a manifest, in a store the deployer names
(`--recordings`: a directory, or an fsspec URL with the `recordings` extra).

- `ids`: recording ids (unguessable; the only names a client may use to reach the store).
- `store`: where recordings live and how they are found, listed, evicted and deleted.
- `recorder`: one session's recording, written off the event loop (never delays the stream).
"""
