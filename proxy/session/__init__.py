"""One session and every part that lives and dies with it: its phase, its Triton stream and its
moves to another Triton, the order its replies reach the owner, its acks and event book, its
participants coming and going (attachments, resume), a takeover read back into its parts, and
its ending."""
