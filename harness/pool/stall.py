"""Noticing ranks that all wait in collectives and no longer move, before the deadline.

Ranks that entered collectives that do not match (without collective checking) wait until
the process-group timeout; no rank finishes, so the lonely-rank grace does not apply. A
:class:`StallProbe` samples the waiting ranks' Python stacks (``faulthandler``, from a rank
thread that holds the GIL: see [Note: stack dumps hold the GIL] in
:mod:`harness.rank.worker`) and their CPU time: when two samples ``every`` seconds apart
show every waiting rank inside a c10d collective, with the same stack and (almost) no CPU
time spent in between, and none of their threads waiting for a core in both, the ranks
are stuck. The pool then ends the job as hung, and the
controller replays it with collective checking (a stall that was not one passes there).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field

from harness.verdicts.collectives import waiting_collective
from harness.verdicts.outcomes import tidy_stacks

__all__ = ["StallProbe", "cpu_seconds", "runnable_threads"]

IDLE_CPU = 0.1  # seconds of CPU a rank blocked in a collective may use between two samples


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process (Linux ``/proc``), or ``None``."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def runnable_threads(pid: int) -> int | None:
    """Threads of process ``pid`` that are running or waiting for a core (``R``)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    count = 0
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        count += state == "R"
    return count


@dataclass
class StallProbe:
    """Samples at ``began + first``, then every ``every`` seconds.

    Args:
        next_at: when the next sample is due (``time.monotonic()`` seconds).
        every: seconds between samples.
    """

    next_at: float
    every: float
    _last: dict[int, tuple[str, float | None, int | None]] = field(default_factory=dict)

    def sample(self, now: float, stacks: dict[int, str], pids: Sequence[int]) -> bool:
        """Take one sample (``stacks`` and ``pids`` by waiting rank); return whether every
        waiting rank is stuck in a collective since the previous sample."""
        self.next_at = now + self.every
        current = {
            r: (tidy_stacks(s), cpu_seconds(pids[r]), runnable_threads(pids[r]))
            for r, s in stacks.items()
        }
        if not current or any(waiting_collective(s) is None for s, _, _ in current.values()):
            self._last = {}
            return False
        previous, self._last = self._last, current
        return (
            bool(previous)
            and previous.keys() == current.keys()
            and all(_still(previous[r], current[r]) for r in current)
        )


def _still(
    before: tuple[str, float | None, int | None], after: tuple[str, float | None, int | None]
) -> bool:
    """Same stack, (almost) no CPU, and not waiting for a core in both samples (a rank
    starved on an overloaded machine is not stuck: [Note: slow is not hung] in
    :mod:`harness.pool.progress`)."""
    (stack_a, cpu_a, runnable_a), (stack_b, cpu_b, runnable_b) = before, after
    if stack_a != stack_b or cpu_a is None or cpu_b is None:
        return False
    if runnable_a and runnable_b:
        return False
    return cpu_b - cpu_a < IDLE_CPU
