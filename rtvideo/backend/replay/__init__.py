"""`rtvideo replay`: its command line (`command`, importable without torch or PyAV) and the
recording re-generated in process (`regenerate`)."""
