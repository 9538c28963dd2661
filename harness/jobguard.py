"""A guard called before each rank job is dispatched.

The conformance plugin sets one per check: it ends a Hypothesis search whose shrink budget is
spent (:meth:`harness.conformance.economy.ShrinkPolicy.before_job`), whatever the test's
shape (a ``@given`` test, a state machine, a loop of jobs in one example).
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["JobGuard", "before_job", "set_job_guard"]

JobGuard = Callable[[], None]

_guard: JobGuard | None = None


def set_job_guard(guard: JobGuard | None) -> JobGuard | None:
    """Call ``guard`` before each job is dispatched; returns the previous guard."""
    global _guard
    previous, _guard = _guard, guard
    return previous


def before_job() -> None:
    """Run the guard, if one is set (``run_on_ranks`` calls this before each job)."""
    if _guard is not None:
        _guard()
