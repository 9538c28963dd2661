"""Run under attach mode on two torchrun agents ("nodes") by tests/attach/test_attach_mode.py.

The second node's ranks write a marker file and wait; the test then kills that node (its
agent and its ranks). Attach mode must end the run with a report naming the silent ranks.
"""

from __future__ import annotations

import os
import time
from typing import Any

from harness import run_on_ranks


def _wait_to_be_killed(ctx: Any) -> int:
    if ctx.rank == 2:
        with open(os.environ["SHARDCHECK_TEST_MARKER"], "w") as marker:
            marker.write("node 1 is in the job\n")
    time.sleep(90)
    return int(ctx.rank)


def test_a_node_dies_during_a_job() -> None:
    run_on_ranks(_wait_to_be_killed, world_size=4, timeout=150)


def test_never_runs() -> None:
    print("THIS TEST MUST NOT RUN")
