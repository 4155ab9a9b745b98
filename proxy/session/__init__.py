"""One session: its phase, its Triton stream, the order its replies reach the owner, its acks
and event book, and its ending."""
