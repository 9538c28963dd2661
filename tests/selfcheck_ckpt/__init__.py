"""Self-check of the checkpoint suites: deliberately broken strategies must be caught."""
