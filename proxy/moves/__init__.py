"""Live sessions that move to another Triton (docs/recordings.md "Moves"): what a move needs to
start a session again elsewhere (`log`), how the new stream continues the old one (`splice`),
and one session's moves (`session_moves`)."""
