"""A pytest plugin (``-p selfcheck_cost.no_tracker``) that makes this torch look like one
without ``MemTracker``: loaded before the suites import, so they see no memory instrument."""

from __future__ import annotations

import harness.torch_compat


def _none() -> None:
    return None


harness.torch_compat.memory_tracker = _none  # type: ignore[assignment]
