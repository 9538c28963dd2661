"""The files each rank of a pool writes and the controller reads.

Per pool generation, every rank has three files under ``<session>/ws<N>-g<gen>/``: its
stdout and stderr (the rank points fd 1 and 2 at them and empties them at each job start)
and its stack file (``faulthandler`` writes the fatal-error dump there, and the stacks of all
threads on ``SIGUSR1``). The controller reads them after a job, a crash or a hang, so output
and stacks survive a rank that died.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

from harness.outcomes import Outcome

__all__ = ["RankFiles"]


class RankFiles:
    """Paths of one pool generation's per-rank files, and reading them.

    Args:
        directory: the generation's directory (created here).
        world_size: number of ranks.
    """

    def __init__(self, directory: str, world_size: int) -> None:
        os.makedirs(directory, exist_ok=True)
        self.directory = directory
        self._stack_pos = [0] * world_size

    def path(self, rank: int, what: str) -> str:
        """``stdout``, ``stderr`` or ``stacks`` file of ``rank``."""
        return os.path.join(self.directory, f"rank{rank}.{what}")

    def read_output(self, outcomes: Sequence[Outcome]) -> None:
        """Fill each outcome's ``stdout`` and ``stderr`` from its rank's files."""
        for outcome in outcomes:
            outcome.stdout = _read_text(self.path(outcome.rank, "stdout"))
            outcome.stderr = _read_text(self.path(outcome.rank, "stderr"))

    def new_stacks(self, rank: int, peek: bool = False) -> str:
        """What the rank's stack file gained since the last (non-peeking) read."""
        try:
            with open(self.path(rank, "stacks"), "rb") as f:
                f.seek(self._stack_pos[rank])
                data = f.read()
        except OSError:
            return ""
        if not peek:
            self._stack_pos[rank] += len(data)
        return data.decode("utf-8", "replace")

    def collect_stacks(self, ranks: Sequence[int], settle: float = 2.0) -> dict[int, str]:
        """Wait (at most ``settle`` s) for the dumps of ``ranks``, already signalled."""
        stacks: dict[int, str] = {}
        deadline = time.monotonic() + settle
        while time.monotonic() < deadline and len(stacks) < len(ranks):
            time.sleep(0.05)
            for rank in ranks:
                if rank not in stacks:
                    text = self.new_stacks(rank, peek=True)
                    if text.endswith("\n"):
                        stacks[rank] = self.new_stacks(rank)
        return stacks


def _read_text(path: str) -> str:
    try:
        if os.stat(path).st_size == 0:
            return ""
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""
