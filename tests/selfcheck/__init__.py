"""Self-check: deliberately broken strategies that the suites must catch (issue 5, item 5)."""
