"""Bounded ranks: what a rank holds is read after every job, kept per rank, and a rank that
holds more than its bound is replaced (see [Note: bounded ranks] in harness.rank.usage)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch.distributed as dist

import harness.torch_compat as torch_compat
from harness import RankContext, run_on_ranks
from harness.pool.stall import cpu_seconds
from harness.pool.usage import PoolUsage, leak_warning, usage_line
from harness.rank import usage as rank_usage
from harness.rank.usage import THREAD_ALLOWANCE, UsageGuard, sample
from harness.run.session import current
from harness.verdicts.outcomes import Outcome, RankFailure
from harness.wire.protocol import Usage

#: groups a job of this module keeps alive, as a strategy with a module-level cache would
_KEPT: list[Any] = []


def keep_a_group(ctx: RankContext) -> float:
    group = dist.new_group(list(range(ctx.world_size)))
    t = torch.ones(1)
    dist.all_reduce(t, group=group)
    _KEPT.append(group)  # the harness destroys it after the job; this keeps it alive
    return t.item()


def threads_now(ctx: RankContext) -> int:
    return sample().threads  # type: ignore[union-attr]


def test_sample_reads_this_process() -> None:
    usage = sample()
    assert usage is not None
    assert usage.threads >= 1 and usage.open_files >= 3 and usage.rss_mib > 10
    assert usage.recycle == ""


def test_guard_collects_first_and_asks_to_recycle_only_when_still_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    figures = iter([Usage(10, 100.0, 20)])
    monkeypatch.setattr(rank_usage, "sample", lambda: next(figures))
    collected: list[int] = []
    guard = UsageGuard(lambda: collected.append(1))
    over = Usage(10 + THREAD_ALLOWANCE + 1, 100.0, 20)
    # over the bound, back under it after the collection: no recycle
    figures = iter([over, Usage(12, 100.0, 20)])
    assert guard.after_job() == Usage(12, 100.0, 20)
    assert collected == [1]
    # still over after the collection: the rank asks to be recycled, saying what
    figures = iter([over, over])
    assert guard.after_job().recycle == "threads"  # type: ignore[union-attr]
    assert collected == [1, 1]
    # under the bound: no collection at all
    figures = iter([Usage(11, 100.0, 20)])
    assert guard.after_job() == Usage(11, 100.0, 20)
    assert collected == [1, 1]
    assert guard.over(Usage(10, 100.0 + 1025, 20 + 257)) == "open files, memory"


def test_pool_usage_keeps_first_last_and_peaks_per_rank() -> None:
    pool = PoolUsage()
    for threads, recycle in ((9, ""), (40, ""), (12, "threads")):
        outcomes = [
            Outcome(rank, "ok", usage=Usage(threads + rank, 300.0 + threads, 20, recycle=recycle))
            for rank in range(2)
        ]
        asked = pool.note(outcomes)
    assert asked == "threads"
    assert pool.recycles == [([0, 1], "threads")]
    figures = pool.as_dict()["ranks"]["1"]
    assert figures["threads"] == {"first": 10, "last": 13, "peak": 41}
    assert figures["rss_mib"]["peak"] == 340.0 and figures["jobs"] == 3
    line = usage_line({2: pool})
    assert "world size 2: threads 10 -> 13 (peak 41)" in line and "recycled 1 time" in line
    warning = leak_warning({2: pool}, "mypkg:make_strategy")
    assert "mypkg:make_strategy" in warning and "threads" in warning and "1 time" in warning
    assert leak_warning({2: PoolUsage()}, "x:y") == ""


def test_a_job_that_keeps_groups_alive_gets_its_ranks_recycled() -> None:
    session = current()
    assert run_on_ranks(keep_a_group, world_size=2) == [2.0, 2.0]
    start = min(run_on_ranks(threads_now, world_size=2))
    for _ in range(40):
        assert run_on_ranks(keep_a_group, world_size=2) == [2.0, 2.0]
    causes = [h.cause for h in session.heals if h.world_size == 2]
    assert "recycled (threads over the bound)" in causes
    pool = session.usage[2]
    assert pool.recycles and all(ranks == [0, 1] for ranks, _ in pool.recycles)
    for rank, kept in pool.ranks.items():  # every rank stayed within the bound (+ one job)
        assert kept.peak.threads <= start + THREAD_ALLOWANCE + 6, (rank, kept.as_dict())
    assert max(run_on_ranks(threads_now, world_size=2)) <= start + THREAD_ALLOWANCE


def test_clearing_dtensor_caches_lets_go_of_meshes() -> None:
    """The caches of [Note: DTensor caches keep groups alive] are empty afterwards."""
    from torch.distributed.tensor import _redistribute

    _redistribute._planner_cache[("mesh", "meta")] = object()  # type: ignore[index]
    torch_compat.clear_sharding_cache()
    assert _redistribute._planner_cache == {}
    assert _redistribute._gen_transform_infos.cache_info().currsize == 0


def test_ranks_waiting_for_a_job_use_no_cpu() -> None:
    """A rank between jobs blocks on its pipe and its gloo threads sleep: no busy loop,
    also with the groups of earlier jobs still waiting for their collection."""
    for _ in range(3):
        assert run_on_ranks(keep_a_group, world_size=2) == [2.0, 2.0]
    pids = current().pools[2].pids
    before = [cpu_seconds(pid) for pid in pids]
    time.sleep(2.0)
    after = [cpu_seconds(pid) for pid in pids]
    used = [b - a for a, b in zip(before, after, strict=True)]  # type: ignore[operator]
    assert all(u < 0.1 for u in used), f"CPU seconds used in 2 s of waiting, by rank: {used}"


@dataclass(frozen=True)
class FrozenError(Exception):
    """An exception type that refuses attribute assignment (its ``__traceback__`` too)."""

    what: str


def raise_frozen(ctx: RankContext) -> None:
    raise FrozenError(f"rank {ctx.rank} refused")


def test_a_job_error_that_refuses_assignment_still_comes_back_as_raised() -> None:
    """The runner drops a job error's frames before reading the rank's usage: an exception
    that is a frozen dataclass must come back as itself, not crash the rank."""
    with pytest.raises(RankFailure) as info:
        run_on_ranks(raise_frozen, world_size=2)
    for rank, outcome in enumerate(info.value.outcomes):
        assert outcome.kind == "raised", outcome
        assert outcome.error is not None and f"rank {rank} refused" in str(outcome.error)
        assert outcome.usage is not None and outcome.usage.threads > 0
    assert run_on_ranks(threads_now, world_size=2)[0] > 0  # the ranks were not replaced
