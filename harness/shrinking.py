"""Shrink a hang or desync at most once: take the example that showed it as final.

Hypothesis shrinks a failure by running smaller examples until none fails the same way. A
hang or desync is one bug whatever the example's size, and every failing run costs a pool
heal and up to a grace or deadline; so once a job failed that way, :func:`shrink_once` tells
the running Hypothesis engine to stop there: the failing example is reported as it is (a
failure found while shrinking is that one shrink), then replayed once by Hypothesis, which
reruns it (the same exception type from the same line: never a ``FlakyFailure``).

This reaches into Hypothesis' engine (``ConjectureRunner.shrinks``, checked against
``MAX_SHRINKS`` whenever a smaller failing example is found, in Hypothesis 6.1xx): when the
engine is not found as expected, it does nothing and Hypothesis shrinks as usual.
"""

from __future__ import annotations

import sys
from types import FrameType
from typing import Any

__all__ = ["in_engine", "shrink_once"]


def _runner() -> Any:
    """The running ``ConjectureRunner`` on this thread's stack, or ``None``."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        runner: Any = frame.f_locals.get("self")
        if type(runner).__name__ == "ConjectureRunner" and isinstance(
            getattr(runner, "shrinks", None), int
        ):
            return runner
        frame = frame.f_back
    return None


def shrink_once() -> bool:
    """Inside a Hypothesis run: stop generating and shrinking after this failing example.

    Returns whether the running engine was found (outside Hypothesis: ``False``).
    """
    engine = sys.modules.get("hypothesis.internal.conjecture.engine")
    limit = getattr(engine, "MAX_SHRINKS", None)
    runner = _runner() if isinstance(limit, int) else None
    if runner is None:
        return False
    runner.shrinks = max(runner.shrinks, limit)
    return True


def in_engine() -> bool:
    """Whether this example runs inside Hypothesis' search (generating or shrinking), not
    in the final replay of the failing example that Hypothesis reports."""
    return _runner() is not None
