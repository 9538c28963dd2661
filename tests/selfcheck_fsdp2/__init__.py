"""Self-check of the fsdp2 family's clauses: planted FSDP2 bugs, each caught by its clause."""
