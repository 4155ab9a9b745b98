"""A local ``tritonserver`` for the model repository, split by job.

- :mod:`.install`: where the binary and its backends come from (``$TRITONSERVER``,
  ``PATH`` as in the NGC container, or the ``nvidia-pytriton`` wheel);
- :mod:`.server`: running it (start, gRPC health polling, stop without leftover stubs or
  shared memory; the server dies with its launcher);
- :mod:`.shm_files`: the Python backend's shared-memory files, named by launcher, and their removal;
- :mod:`.logs`: its log (a file, or relayed to standard error), and what of it to show when it fails;
- :mod:`.access`: its access key (``--grpc-restricted-protocol``), the clients' header, the
  per-session secret and the short hash that logs show instead of ids and secrets.
"""
