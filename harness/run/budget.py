"""The running test's time: the harness gives its verdict before pytest-timeout ends the test.

[Note: the test's time budget] Each job is bounded (its deadline, graces, ``--rank-timeout``
for a job whose ranks still work: docs/deadlines-and-hangs.md), but a test runs several jobs,
and nothing bounded their sum. An example of CKPT-RT-6 runs a probe, a save and a load; a
job that hangs is cut off at its deadline (30 s for a check's first), replayed with
collective checking, and Hypothesis runs the failing example once more at the end, each time
after a heal of the ranks; on a busy machine each cutoff moves on while the ranks still use
CPU, up to ``--rank-timeout`` (120 s). A few of those add up past pytest-timeout's 300 s,
whose ``Timeout`` then tells no rank's story at all: the finding of a strategy with a broken
full save read ``Timeout (>300.0s) from pytest-timeout``. Nor does it end a Hypothesis test:
its signal raises pytest's ``Failed`` inside the test, which Hypothesis takes for one
example's failure, and the search goes on (CKPT-RT-6 with a barrier on rank 0 only, under a
20 s limit: 48.7 s, read ``failed``; with this budget, ``hang`` at 15.2 s).

So a test with a pytest-timeout limit ``T`` (its ``timeout`` mark, ``--timeout``,
``PYTEST_TIMEOUT`` or the ``timeout`` ini value, as pytest-timeout reads them) has a
:class:`TestBudget`: from the start of the test, the harness keeps the last
:func:`reserve` seconds (5% of ``T``, at least 5 s: the stack dumps, the end of the ranks,
the report) for its verdict, and bounds every job by the rest:

- a job still running when the budget ends is cut off there (the pool's final cutoff): its
  ranks still inside are ``hung`` with every rank's stack, the detail saying the test's time
  ran out, and the verdict (:func:`harness.verdicts.failures.failure_for`) names the hang;
- a job that hung is replayed with collective checking while the budget lasts; a replay cut
  off by it that names no desync leaves the first run's outcomes as the verdict's;
- a failure that ends past the budget ends Hypothesis' search after the running example, and
  once the budget is spent every later job of the test (Hypothesis' replay of the failing
  example) raises the test's last failure again at once, from the same line, without
  running: the verdict. So does a job (or a start of the ranks) that ends past the budget in
  a test that failed before: the budget cut it off, which says nothing of its own;
- a job the budget leaves no time for, in a test with no failure yet, is not sent:
  :class:`TestTimeSpent`.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

from harness.pool.rankpool import PoolStartError
from harness.pool.transport import Bound
from harness.verdicts.outcomes import BUDGET_DETAIL, RankFailure

__all__ = [
    "RESERVE_FLOOR",
    "RESERVE_SHARE",
    "TestBudget",
    "TestTimeSpent",
    "pytest_timeout_of",
    "reserve",
]

#: the share of a test's pytest-timeout limit the harness keeps for its verdict
RESERVE_SHARE = 0.05
#: the least it keeps, seconds: the hung ranks' stack dumps take up to 2 s, ending them and
#: joining their processes up to 5 s more on a busy machine
RESERVE_FLOOR = 5.0
#: the last line of a verdict raised again
_AGAIN = "\n(raised again without running the job: the test's time is spent)"


class TestTimeSpent(RuntimeError):
    """A job was not sent: its test's time budget was spent (the message says how)."""

    __test__ = False  # not a test class, whatever pytest's collection of ``Test*`` says


def pytest_timeout_of(item: Any) -> float:
    """pytest-timeout's limit for ``item`` in seconds, as pytest-timeout reads it (its
    ``timeout`` mark, else ``--timeout``, else ``PYTEST_TIMEOUT``, else the ``timeout`` ini
    value); 0 for none, or without pytest-timeout."""
    marker = item.get_closest_marker("timeout")
    if marker is not None:
        value = marker.kwargs.get("timeout", marker.args[0] if marker.args else None)
        if value is not None:
            return _seconds(value)
    config = item.config
    value = config.getoption("timeout", None)
    if value is None:
        value = os.environ.get("PYTEST_TIMEOUT") or None
    if value is None:
        try:
            value = config.getini("timeout")
        except (ValueError, KeyError):  # no pytest-timeout: no ini value of that name
            return 0.0
    return _seconds(value)


def _seconds(value: Any) -> float:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return 0.0  # pytest-timeout refuses it itself, with its own message
    return max(seconds, 0.0)


def reserve(timeout: float) -> float:
    """The seconds at the end of a test of pytest-timeout limit ``timeout`` that the harness
    keeps for its verdict (never more than half of it)."""
    return min(max(RESERVE_FLOOR, RESERVE_SHARE * timeout), timeout / 2)


@dataclass
class TestBudget:
    """The time of the running test (see [Note: the test's time budget]).

    Args:
        timeout: pytest-timeout's limit of the test, seconds (positive).
        started: when the test began (``time.monotonic()``).
        verdict: the test's last failure (a job's, or a start of the ranks cut off), raised
            again by every job once the budget is spent.
    """

    __test__ = False

    timeout: float
    started: float
    verdict: RankFailure | PoolStartError | None = None

    @classmethod
    def of(cls, item: Any) -> TestBudget | None:
        """The budget of ``item``, starting now; ``None`` when pytest-timeout does not bound it."""
        timeout = pytest_timeout_of(item)
        return cls(timeout, time.monotonic()) if timeout > 0 else None

    @property
    def ends_at(self) -> float:
        """When the budget ends (``time.monotonic()``)."""
        return self.started + self.timeout - reserve(self.timeout)

    def left(self) -> float:
        """Seconds until the budget ends (negative once it has)."""
        return self.ends_at - time.monotonic()

    def spent(self) -> bool:
        """Whether the budget has ended."""
        return self.left() <= 0

    def why(self) -> str:
        """The ``detail`` of a rank cut off when the budget ended."""
        used = self.ends_at - self.started
        return (
            f"{BUDGET_DETAIL} ({used:.1f} s into the test, of pytest-timeout's "
            f"{self.timeout:g} s; the harness keeps the last {reserve(self.timeout):.1f} s for "
            "its verdict)"
        )

    def bound(self) -> Bound:
        """The pool's final cutoff for a job of this test."""
        return Bound(self.ends_at, self.why())

    def again(self) -> RankFailure | PoolStartError:
        """The verdict, to raise again: a fresh exception of the same type and story (the
        story's first line names the job that failed), the last line saying it did not run."""
        verdict = self.verdict
        assert verdict is not None
        message = f"{str(verdict).split(_AGAIN)[0]}{_AGAIN}"
        if isinstance(verdict, RankFailure):
            return type(verdict)(message, verdict.outcomes)
        return type(verdict)(message)

    def not_sent(self, what: str) -> TestTimeSpent:
        """The error for a job the budget left no time for."""
        took = time.monotonic() - self.started
        return TestTimeSpent(
            f"{what} was not sent: the test's time is spent ({took:.1f} s of pytest-timeout's "
            f"{self.timeout:g} s; the harness keeps the last {reserve(self.timeout):.1f} s for "
            "its verdict), though no job of it failed. Give the test more time (its "
            "@pytest.mark.timeout, or --timeout) or make it do less per example."
        )
