"""Run under attach mode by tests/attach/test_attach_mode.py (not collected on its own).

Every test asserts on each of torchrun's four ranks: a job whose ranks all answer, one where
rank 2 raises, one where rank 1 hangs (the pool heals: the next job passes on all ranks),
jobs at every smaller world size on the first ranks (sub-worlds, each an ordinary default
process group), checks at a world size larger than torchrun's that attach mode reports as
``environment``, and Hypothesis tests whose examples at such a size are dropped one by one.
"""

from __future__ import annotations

import os
import time
from typing import Any

import pytest
import torch
import torch.distributed as dist
from hypothesis import example, given, settings
from hypothesis import strategies as st

from harness import RankFailure, run_on_ranks


def _sum_ranks(ctx: Any) -> tuple[int, int, float, int]:
    t = torch.tensor([float(ctx.rank)])
    dist.all_reduce(t)
    print(f"rank {ctx.rank} says hello")
    return ctx.rank, ctx.world_size, t.item(), os.getpid()


def _group_seen(ctx: Any) -> tuple[int, int, int, int, float, int]:
    t = torch.tensor([float(ctx.rank + 1)])
    dist.all_reduce(t)
    rank, world = dist.get_rank(), dist.get_world_size()
    return ctx.rank, ctx.world_size, rank, world, t.item(), os.getpid()


def _raise_on_rank_2(ctx: Any) -> int:
    if ctx.rank == 2:
        raise ValueError(f"deliberate failure on rank {ctx.rank}")
    return ctx.rank


def _hang_on_rank_1(ctx: Any) -> int:
    if ctx.rank == 1:
        time.sleep(3600)
    return ctx.rank


def _assert_all_ranks_answer() -> None:
    results = run_on_ranks(_sum_ranks, world_size=4)
    for rank, (seen_rank, world, total, _pid) in enumerate(results):
        assert (seen_rank, world, total) == (rank, 4, 6.0), f"rank {rank}"
    assert len({pid for *_, pid in results}) == 4  # four distinct torchrun processes


def test_every_rank_answers() -> None:
    _assert_all_ranks_answer()


def test_a_raising_rank_is_attributed() -> None:
    with pytest.raises(RankFailure) as info:
        run_on_ranks(_raise_on_rank_2, world_size=4)
    outcomes = info.value.outcomes
    assert [o.kind for o in outcomes] == ["ok", "ok", "raised", "ok"]
    assert [o.value for o in outcomes if o.ok] == [0, 1, 3]
    error = outcomes[2].error
    assert error is not None and error.type_name == "ValueError"
    assert "deliberate failure on rank 2" in error.message
    assert "_raise_on_rank_2" in error.traceback
    assert "rank 2 raised ValueError: deliberate failure on rank 2" in str(info.value)


def test_a_hanging_rank_is_attributed_with_its_stack() -> None:
    with pytest.raises(RankFailure) as info:
        run_on_ranks(_hang_on_rank_1, world_size=4, timeout=5)
    outcomes = info.value.outcomes
    assert [o.kind for o in outcomes] == ["ok", "hung", "ok", "ok"]
    assert [o.value for o in outcomes if o.ok] == [0, 2, 3]
    assert "still running at the deadline (5.0 s)" in outcomes[1].detail
    assert "_hang_on_rank_1" in outcomes[1].stacks
    assert "shardcheck-watchdog" not in outcomes[1].stacks


def test_the_pool_healed_after_the_hang() -> None:
    _assert_all_ranks_answer()


def test_every_smaller_size_is_a_default_group_of_the_first_ranks() -> None:
    pids = [r[-1] for r in run_on_ranks(_group_seen, world_size=4)]
    for k in (1, 3, 2, 4, 2):  # there and back: each switch forms a new default group
        results = run_on_ranks(_group_seen, world_size=k)
        expected = [(r, k, r, k, float(k * (k + 1) // 2)) for r in range(k)]
        assert [r[:5] for r in results] == expected, k
        assert [r[-1] for r in results] == pids[:k]  # the first k of torchrun's processes


@pytest.mark.world_size(2, 5)
def test_a_larger_world_size_is_environment(world_size: int) -> None:
    results = run_on_ranks(_sum_ranks, world_size=world_size)
    assert [r[:3] for r in results] == [(0, 2, 1.0), (1, 2, 1.0)]


def test_run_on_ranks_at_a_larger_size_skips_as_environment() -> None:
    with pytest.raises(pytest.skip.Exception, match="environment: needs world size 5"):
        run_on_ranks(_sum_ranks, world_size=5)


@given(st.just(4))
@example(5)
@settings(max_examples=2, database=None)
def test_an_explicit_example_at_a_larger_size_is_dropped(world_size: int) -> None:
    results = run_on_ranks(_sum_ranks, world_size=world_size)  # the example at 5 stops here
    assert world_size == 4
    assert [r[:3] for r in results] == [(rank, 4, 6.0) for rank in range(4)]


@given(st.sampled_from([5, 6]))
@settings(max_examples=3, database=None)
def test_no_example_fits_is_environment(world_size: int) -> None:
    run_on_ranks(_sum_ranks, world_size=world_size)
