"""Child processes that die with their parent: the launcher (death signal, priority) and the stub's watchdog. Standard library only."""
