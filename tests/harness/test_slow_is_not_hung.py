"""Slow is not hung: ranks that work past their deadline get more time, ranks that wait do
not (see [Note: slow is not hung] in harness.pool.progress)."""

from __future__ import annotations

import time

import pytest
import torch

from harness import RankContext, run_on_ranks
from harness.pool.progress import OVERLOAD, MachineLoad, Sample, moved_line, progress
from harness.run.session import current
from harness.verdicts.failures import CollectiveHang

C10D = "/venv/torch/distributed/distributed_c10d.py"
STACK = f'Thread 1 (most recent call first):\n  File "{C10D}", line 3 in all_gather_object\n'
IDLE = 'Thread 1 (most recent call first):\n  File "/x/y.py", line 3 in sleep\n'


def _sample(
    at: float,
    cpu: float | None = 1.0,
    stack: str = STACK,
    runnable: int | None = 0,
    load: MachineLoad | None = None,
) -> Sample:
    return Sample(at, {0: cpu, 1: 1.0}, {0: stack, 1: STACK}, {0: runnable, 1: 0}, load)


def test_a_rank_that_had_the_cores_it_wanted_is_not_excused() -> None:
    """More CPU than half its deadline spent in the job: it computes without end."""
    before, after = _sample(0.0, runnable=2), _sample(2.0, cpu=3.0, runnable=2)
    assert progress(before, after, spent={0: 1.9}, deadline=4.0) == (
        "rank 0 used 2.00 s of CPU in 2.0 s"
    )
    assert progress(before, after, spent={0: 2.1}, deadline=4.0) == ""


def test_ranks_that_wait_do_not_count_as_working() -> None:
    idle = MachineLoad(average=1.0, cores=2, total=1000, steal=0)
    assert progress(_sample(0.0, load=idle), _sample(2.0, cpu=1.01, load=idle), 4) == ""


@pytest.mark.parametrize(
    "after, words",
    [
        (_sample(2.0, cpu=1.5), "rank 0 used 0.50 s of CPU in 2.0 s"),
        (_sample(2.0, stack=STACK + '  File "/y.py", line 9 in step\n'), "rank 0's stack moved"),
        (_sample(2.0, runnable=3), "rank 0 has 3 runnable threads"),
    ],
    ids=["cpu", "stack", "runnable"],
)
def test_a_rank_that_works_moves_the_cutoff_on(after: Sample, words: str) -> None:
    before = _sample(0.0, runnable=2)
    assert progress(before, after) == words
    assert progress(before, after, own_ranks=4) == words


def test_an_overloaded_machine_counts_only_while_no_rank_finished() -> None:
    busy = MachineLoad(average=4 + 2 * OVERLOAD + 1, cores=2, total=2000, steal=0)
    before, after = _sample(0.0, load=busy), _sample(2.0, load=busy)
    assert progress(before, after, own_ranks=4) == (
        "the machine is overloaded (load average 9.0 on 2 cores)"
    )
    assert progress(before, after, own_ranks=None) == ""  # a lonely rank waits on a peer
    # a rank outside any collective that neither runs nor waits for a core is idle
    idle = _sample(0.0, stack=IDLE, load=busy), _sample(2.0, stack=IDLE, load=busy)
    assert progress(*idle, own_ranks=4) == ""
    # the pool's own ranks are not other load: 4 ranks + 1 on 2 cores is not overloaded
    own = MachineLoad(average=5.0, cores=2, total=2000, steal=0)
    assert progress(_sample(0.0, load=own), _sample(2.0, load=own), own_ranks=4) == ""
    stolen = MachineLoad(average=1.0, cores=2, total=2000, steal=300)
    was = MachineLoad(average=1.0, cores=2, total=1000, steal=100)
    assert progress(_sample(0.0, load=was), _sample(2.0, load=stolen), own_ranks=4) == (
        "the machine is overloaded (20% of CPU time stolen)"
    )


def compute_for(ctx: RankContext, seconds: float) -> int:
    """Work inside one call for ``seconds`` (no collective), getting a fifth of a core as on
    a busy machine (10 ms of work, then 40 ms off): a slow job, not a stuck one."""
    end = time.monotonic() + seconds
    x = torch.ones(64, 64)
    while time.monotonic() < end:
        burst = time.monotonic() + 0.01
        while time.monotonic() < burst:
            x = (x @ x).clamp_(max=1.0)
        time.sleep(0.04)
    return ctx.rank


def sleep_for(ctx: RankContext, seconds: float) -> int:
    time.sleep(seconds)
    return ctx.rank


def test_ranks_that_compute_past_their_deadline_finish() -> None:
    run_on_ranks(compute_for, 0.0, world_size=2)  # the pool is up: time the job only
    start = time.monotonic()
    moved = current().cutoffs_moved.setdefault(2, [])
    before = len(moved)
    assert run_on_ranks(compute_for, 6.0, world_size=2, timeout=3.0) == [0, 1]
    assert 6.0 <= time.monotonic() - start < 14.0
    assert len(moved) == before + 1 and "s of CPU in" in moved[-1]  # counted, with why


def test_the_end_of_run_line_counts_moved_cutoffs_per_world_size() -> None:
    assert moved_line({2: [], 4: []}) == ""
    line = moved_line({2: ["rank 0 used 0.50 s of CPU in 2.0 s"], 4: ["x", "y"]})
    assert line == (
        "job cutoffs moved on 3 times while ranks still worked (world size 2: 1, world size "
        "4: 2; the first because rank 0 used 0.50 s of CPU in 2.0 s)"
    )


def test_ranks_that_neither_run_nor_wait_for_a_core_are_hung_at_the_deadline() -> None:
    run_on_ranks(sleep_for, 0.0, world_size=2)
    start = time.monotonic()
    with pytest.raises(CollectiveHang) as info:
        run_on_ranks(sleep_for, 30.0, world_size=2, timeout=3.0)
    took = time.monotonic() - start
    assert all(o.kind == "hung" for o in info.value.outcomes)
    assert all("still running at the deadline (3.0 s)" in o.detail for o in info.value.outcomes)
    assert took < 10.0, f"named after {took:.1f} s: {info.value.outcomes[0].detail}"
    assert run_on_ranks(sleep_for, 0.0, world_size=2) == [0, 1]  # the pool healed
