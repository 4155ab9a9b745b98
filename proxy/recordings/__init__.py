"""Server-side recordings of sessions (docs/recordings.md): the stream exactly as sent, an
event log of every JSON message in and out, and a manifest, in a store the deployer names
(`--recordings`: a directory, or an fsspec URL with the `recordings` extra).

- `ids`: recording ids (unguessable; the only names a client may use to reach the store).
- `backing`: where a recording's files are (a directory, or an fsspec URL), and nothing else.
- `store`: what recordings may take, and how they are found, listed, evicted and deleted.
- `recorder`: one session's recording, written off the event loop (never delays the stream).
- `reopen`: a recording taken over with its session from another proxy (what it holds, and
  what the session store kept that it lacks).
"""
