"""Job deadlines learned from the jobs that passed, and which check a job belongs to.

A job's deadline is ``min(ceiling, max(floor, factor x the slowest passing job of the same
check and rank function))``; a job with no passing predecessor gets ``first`` (capped by the
ceiling). The ceiling is ``--rank-timeout``. A hang is then noticed in seconds, not minutes,
once a check has shown how long its jobs take; a job that is merely slower than the ones
before it still has twenty times their time.

[Note: the first job's deadline] The first job of a check (on this 2-core machine the
suites' jobs take 0.05-2 s, the slowest first jobs up to ~8 s with four ranks) gets
``first`` = 30 s: generous for a slow first job on a loaded machine, short enough that a
desync that hangs every rank without collective checking is noticed in half a minute, not
two. Ranks left alone in a collective after others finished are named sooner still, by the
pool's lonely-rank grace, whatever the deadline.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field

from harness.verdicts.outcomes import Outcome

__all__ = ["Deadlines", "current_check"]


def current_check(fallback: str) -> str:
    """The pytest node id of the running test (``fallback`` outside a test)."""
    current = os.environ.get("PYTEST_CURRENT_TEST")
    if not current:
        return fallback
    return current.rsplit(" ", 1)[0]  # drop pytest's " (call)" phase suffix


@dataclass
class Deadlines:
    """Deadlines per (check, rank function), from the slowest passing job seen.

    Args:
        ceiling: the largest deadline (``--rank-timeout``).
        first: the deadline of a job with nothing learned yet (capped by ``ceiling``).
        floor: the smallest learned deadline.
        factor: learned deadline = ``factor`` x the slowest passing job.
    """

    ceiling: float
    first: float = 30.0
    floor: float = 10.0
    factor: float = 20.0
    slowest: dict[tuple[str, str], float] = field(default_factory=dict)

    def deadline(self, check: str, fn: str) -> float:
        """The deadline of the next job of ``fn`` in ``check``."""
        seen = self.slowest.get((check, fn))
        if seen is None:
            return min(self.ceiling, self.first)
        return min(self.ceiling, max(self.floor, self.factor * seen))

    def learn(self, check: str, fn: str, outcomes: Sequence[Outcome]) -> None:
        """Remember the job's time if every rank passed."""
        if not outcomes or not all(o.ok for o in outcomes):
            return
        took = max(o.elapsed for o in outcomes)
        key = (check, fn)
        self.slowest[key] = max(took, self.slowest.get(key, 0.0))
