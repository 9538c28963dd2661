"""Run under attach mode by tests/attach/test_attach_mode.py (not collected on its own).

Rank 3 dies in the second test; torchrun stops the other ranks, and attach mode must end the
run with a report naming the silent ranks instead of waiting for them. The third test must
never start.
"""

from __future__ import annotations

import os
import time
from typing import Any

from harness import run_on_ranks


def _rank(ctx: Any) -> int:
    return int(ctx.rank)


def _rank_3_dies(ctx: Any) -> int:
    if ctx.rank == 3:
        os._exit(3)
    time.sleep(60)
    return int(ctx.rank)


def test_before_the_crash() -> None:
    assert run_on_ranks(_rank, world_size=4) == [0, 1, 2, 3]


def test_rank_3_dies() -> None:
    run_on_ranks(_rank_3_dies, world_size=4)


def test_never_runs() -> None:
    print("THIS TEST MUST NOT RUN")
    run_on_ranks(_rank, world_size=4)
