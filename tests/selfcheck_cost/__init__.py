"""Planted cost bugs: strategies that train exactly right at the wrong memory or communication
cost, each caught by a cost clause (CONTRACT.md MEM-* and COMM-*)."""
