"""Shrink a hang or desync at most once: take the example that showed it as final.

Hypothesis shrinks a failure by running smaller examples until none fails the same way. A
hang or desync is one bug whatever the example's size, and every failing run costs a pool
heal and up to a grace or deadline; so once a job failed that way, :func:`shrink_once` tells
the running Hypothesis engine to stop there: the failing example is reported as it is (a
failure found while shrinking is that one shrink), then replayed once by Hypothesis, which
reruns it (the same exception type from the same line: never a ``FlakyFailure``).

:func:`stop_after_this_example` ends the search after the running example (a shrink budget
that is spent): Hypothesis then reports the smallest failing example it has, replayed for real.
Unlike rejecting the example, it never changes what an example does, so it is safe for tests
that draw in their body (``st.data()``), where a rejection before the draws makes Hypothesis
report inconsistent data generation.

This reaches into Hypothesis' engine through :mod:`harness.hypothesis_compat` (the fields it
edits and the versions they were checked on: [Note: the engine's fields] there): when the
engine is not found as expected, these do nothing and Hypothesis shrinks as usual.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from harness.hypothesis_compat import (
    SLOW_SHRINK_WARNING,
    end_search,
    first_bug_found_time,
    running_engine,
    shrink_no_more,
)

__all__ = [
    "first_failure_time",
    "in_engine",
    "quiet_slow_shrinking",
    "shrink_once",
    "stop_after_this_example",
]


def shrink_once() -> bool:
    """Inside a Hypothesis run: stop generating and shrinking after this failing example.

    Returns whether the running engine was found (outside Hypothesis: ``False``).
    """
    return shrink_no_more(running_engine())


def in_engine() -> bool:
    """Whether this example runs inside Hypothesis' search (generating or shrinking), not
    in the final replay of the failing example that Hypothesis reports."""
    return running_engine() is not None


def first_failure_time() -> float | None:
    """Inside a Hypothesis run: when (``time.monotonic()``) it found its first failing
    example, or ``None`` (none yet, or outside Hypothesis' search)."""
    return first_bug_found_time(running_engine())


def stop_after_this_example() -> bool:
    """Inside a Hypothesis run: end the search once the running example is done.

    Hypothesis checks its shrinking deadline after every example; moving it into the past
    ends generation or shrinking there, and the smallest failing example found so far is
    reported. Its "more than five minutes" warning is then not true: run the test inside
    :func:`quiet_slow_shrinking` to drop it. Returns whether the running engine was found.
    """
    return end_search(running_engine())


@contextlib.contextmanager
def quiet_slow_shrinking() -> Iterator[None]:
    """Drop Hypothesis' "spent more than five minutes ... PLEASE REPORT THIS" warning.

    A shrink budget that is spent ends the search through :func:`stop_after_this_example`,
    which makes the warning untrue; without a budget (``nightly``, ``--shrink-budget 0``)
    Hypothesis' own five-minute limit ends it. Either way the failure shows the smallest
    example found so far, and the warning (a request to Hypothesis' maintainers) is noise
    to a strategy's author, printed once per check.
    """
    from hypothesis.reporting import current_reporter, with_reporter

    outer = current_reporter()

    def reporter(value: object) -> None:
        if str(value).startswith(SLOW_SHRINK_WARNING):
            return
        outer(value)

    with with_reporter(reporter):
        yield
