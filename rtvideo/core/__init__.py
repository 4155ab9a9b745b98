"""The pure protocol core: no I/O, no Triton or Tornado imports; shared by backend and proxy."""
