"""Crashing, exiting and hanging ranks: each reported in time, and the next job passes."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import pytest
import torch
import torch.distributed as dist

from harness import RankContext, RankFailure, run_on_ranks
from harness.api import pool_for

DEADLINE = 4.0
SLACK = 6.0  # "within the deadline plus a few seconds", on a loaded 2-core machine


def healthy_job(ctx: RankContext) -> tuple[int, float]:
    t = torch.ones(1)
    dist.all_reduce(t)
    return ctx.rank, t.item()


def assert_next_job_passes(world_size: int) -> None:
    results = run_on_ranks(healthy_job, world_size=world_size)
    assert results == [(r, float(world_size)) for r in range(world_size)]


def segfault_on_rank_one(ctx: RankContext) -> int:
    if ctx.rank == 1:
        os.kill(os.getpid(), signal.SIGSEGV)
    return ctx.rank


def exit_three_on_rank_one(ctx: RankContext) -> int:
    if ctx.rank == 1:
        os._exit(3)
    return ctx.rank


def sys_exit_on_rank_one(ctx: RankContext) -> int:
    if ctx.rank == 1:
        sys.exit(0)
    return ctx.rank


def stuck_in_collective_on_rank_one(ctx: RankContext) -> int:
    if ctx.rank == 1:
        dist.all_reduce(torch.ones(1))  # rank 0 never joins
    return ctx.rank


def endless_loop_on_rank_one(ctx: RankContext) -> int:
    n = 0
    while ctx.rank == 1:
        n += 1
    return ctx.rank


def run_failing(fn, world_size: int = 2) -> tuple[RankFailure, float]:
    assert_next_job_passes(world_size)  # time the failure, not the pool's start
    start = time.monotonic()
    with pytest.raises(RankFailure) as info:
        run_on_ranks(fn, world_size=world_size, timeout=DEADLINE)
    return info.value, time.monotonic() - start


def test_segfault_is_reported_with_rank_and_signal() -> None:
    failure, took = run_failing(segfault_on_rank_one)
    crashed = failure.outcomes[1]
    assert crashed.kind == "crashed"
    assert crashed.signal_name == "SIGSEGV"
    assert crashed.exitcode == -signal.SIGSEGV
    assert "segfault_on_rank_one" in crashed.stacks  # faulthandler's fatal error dump
    assert failure.outcomes[0].ok and failure.outcomes[0].value == 0
    assert "rank 1 crashed: killed by SIGSEGV" in str(failure)
    assert took < SLACK
    assert_next_job_passes(2)


def test_os_exit_is_reported_with_exit_code() -> None:
    failure, took = run_failing(exit_three_on_rank_one)
    crashed = failure.outcomes[1]
    assert crashed.kind == "crashed"
    assert crashed.exitcode == 3
    assert crashed.signal_name is None
    assert "rank 1 crashed: process exited with code 3" in str(failure)
    assert took < SLACK
    assert_next_job_passes(2)


def test_sys_exit_zero_is_reported_as_a_raise_with_traceback() -> None:
    failure, took = run_failing(sys_exit_on_rank_one)
    raised = failure.outcomes[1]
    assert raised.kind == "raised"
    assert raised.error is not None and raised.error.type_name == "SystemExit"
    assert "sys.exit(0)" in raised.error.traceback
    assert "rank 1 raised SystemExit" in str(failure)
    assert took < SLACK
    assert_next_job_passes(2)


def test_rank_stuck_in_a_collective_is_reported_with_its_stack() -> None:
    failure, took = run_failing(stuck_in_collective_on_rank_one)
    stuck = failure.outcomes[1]
    assert stuck.kind in ("hung", "raised")  # the process-group timeout may fire first
    story = stuck.story()
    assert "stuck_in_collective_on_rank_one" in story
    assert "all_reduce" in story
    assert failure.outcomes[0].ok
    assert took < DEADLINE + SLACK
    assert_next_job_passes(2)


def test_endless_python_loop_is_reported_as_hung_with_its_stack() -> None:
    failure, took = run_failing(endless_loop_on_rank_one)
    hung = failure.outcomes[1]
    assert hung.kind == "hung"
    assert "deadline" in hung.detail
    assert "endless_loop_on_rank_one" in hung.stacks
    assert "watch" not in hung.stacks  # the harness's own threads are left out
    assert f"rank 1 hung: still running at the deadline ({DEADLINE:.1f} s)" in str(failure)
    assert DEADLINE <= took < DEADLINE + SLACK
    assert_next_job_passes(2)


def crash_then_raise(ctx: RankContext) -> None:
    if ctx.rank == 2:
        os._exit(5)
    time.sleep(1.5)  # well after rank 2's crash, well inside the 3 s grace
    raise ValueError(f"late failure on rank {ctx.rank}")


def test_story_lists_first_failure_first() -> None:
    failure, _ = run_failing(crash_then_raise, world_size=3)
    assert failure.failed_ranks[0] == 2
    message = str(failure)
    assert message.index("rank 2 crashed") < message.index("rank 0 raised ValueError")
    assert "rank 1 raised ValueError: late failure on rank 1" in message
    assert_next_job_passes(3)


def raise_then_wait(ctx: RankContext) -> None:
    if ctx.rank == 0:
        raise RuntimeError("rank 0 gives up")
    dist.barrier()  # rank 0 never arrives


def test_ranks_left_waiting_after_a_raise_are_stopped_after_a_grace() -> None:
    start = time.monotonic()
    with pytest.raises(RankFailure) as info:
        run_on_ranks(raise_then_wait, world_size=2)  # default settings: no explicit deadline
    assert time.monotonic() - start < 15  # not the deadline
    first, waiting = info.value.outcomes
    assert first.kind == "raised"
    assert waiting.kind == "hung"
    assert "after rank 0 raised" in waiting.detail
    assert "raise_then_wait" in waiting.stacks
    assert_next_job_passes(2)


def new_group_on_rank_zero_then_raise(ctx: RankContext) -> None:
    if ctx.rank == 0:
        dist.new_group([0])  # only rank 0 advances torch's group-naming counter
    else:
        raise RuntimeError("rank 1 raised before creating the group")


def test_health_check_respawns_when_ranks_disagree() -> None:
    pool = pool_for(2)
    run_on_ranks(healthy_job, world_size=2)
    before = pool.pids
    with pytest.raises(RankFailure, match="rank 1 raised RuntimeError"):
        run_on_ranks(new_group_on_rank_zero_then_raise, world_size=2)
    assert not pool.started  # the counters differ: the pool was killed
    assert_next_job_passes(2)
    assert pool.pids != before


def test_health_check_keeps_the_pool_after_a_harmless_raise() -> None:
    pool = pool_for(2)
    run_on_ranks(healthy_job, world_size=2)
    before = pool.pids
    with pytest.raises(RankFailure):
        run_on_ranks(raise_on_both, world_size=2)
    assert pool.pids == before
    assert_next_job_passes(2)


def raise_on_both(ctx: RankContext) -> None:
    raise ValueError("both")


def sleep_long(ctx: RankContext) -> None:
    time.sleep(30)


class Interrupted(Exception):
    pass


def test_interrupted_wait_respawns_the_pool() -> None:
    pool = pool_for(2)
    run_on_ranks(healthy_job, world_size=2)
    old_pids = pool.pids

    def interrupt(signum: int, frame: object) -> None:
        raise Interrupted

    previous = signal.signal(signal.SIGUSR2, interrupt)
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGUSR2))
    timer.start()
    start = time.monotonic()
    try:
        with pytest.raises(Interrupted):
            run_on_ranks(sleep_long, world_size=2, timeout=60)
    finally:
        timer.cancel()
        signal.signal(signal.SIGUSR2, previous)
    assert time.monotonic() - start < 10
    assert not pool.started
    for pid in old_pids:
        assert not _alive(pid)
    assert_next_job_passes(2)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return "\nState:\tZ" not in f.read()
    except FileNotFoundError:
        return False
