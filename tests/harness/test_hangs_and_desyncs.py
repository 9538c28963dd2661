"""Hangs and desyncs named in seconds, as what they are (real multi-rank runs)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from harness import RankContext, run_on_ranks
from harness.verdicts.failures import CollectiveDesync, CollectiveHang

REPO = Path(__file__).resolve().parents[2]


def all_reduce_other_shapes(ctx: RankContext) -> int:
    dist.all_reduce(torch.ones(3 + ctx.rank, 2))
    return ctx.rank


def all_reduce_on_rank_zero_only(ctx: RankContext) -> int:
    if ctx.rank == 0:
        dist.all_reduce(torch.ones(1))  # rank 1 has returned: rank 0 waits alone
    return ctx.rank


def healthy_job(ctx: RankContext) -> float:
    t = torch.ones(1)
    dist.all_reduce(t)
    return t.item()


def test_different_shapes_are_a_desync_naming_both() -> None:
    with pytest.raises(CollectiveDesync) as info:
        run_on_ranks(all_reduce_other_shapes, world_size=2)
    first, second = info.value.outcomes
    for outcome, shape in ((first, "[3, 2]"), (second, "[4, 2]")):
        assert outcome.kind == "raised"
        assert outcome.collective is not None
        assert (outcome.collective.op, outcome.collective.shapes) == ("ALLREDUCE", shape)
        assert outcome.collective.dtypes == "Float"
        assert "all_reduce_other_shapes" in outcome.collective.frame
    message = str(info.value)
    assert message.startswith("desync: the ranks entered collectives that do not match")
    assert "rank 0 entered ALLREDUCE shapes=[3, 2]" in message
    assert "rank 1 entered ALLREDUCE shapes=[4, 2]" in message
    assert run_on_ranks(healthy_job, world_size=2) == [2.0, 2.0]  # the pool healed


def test_lonely_collective_is_named_within_seconds_with_default_settings() -> None:
    run_on_ranks(healthy_job, world_size=2)  # time the hang, not the pool's start
    start = time.monotonic()
    with pytest.raises(CollectiveHang) as info:
        run_on_ranks(all_reduce_on_rank_zero_only, world_size=2)
    took = time.monotonic() - start
    waiting, finished = info.value.outcomes
    assert finished.ok and finished.value == 1
    assert waiting.kind == "hung"
    assert "after rank 1 finished" in waiting.detail
    assert waiting.collective is not None and waiting.collective.op == "all_reduce"
    assert "all_reduce_on_rank_zero_only" in waiting.collective.frame
    message = str(info.value)
    assert "rank(s) 1 finished the job" in message
    assert "rank 0 waits in all_reduce at" in message
    assert took < 15
    assert run_on_ranks(healthy_job, world_size=2) == [2.0, 2.0]


def _run_strict_two(*extra: str) -> tuple[subprocess.CompletedProcess[str], float]:
    paths = [str(REPO), str(REPO / "tests" / "harness"), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    command = [
        sys.executable,
        "-m",
        "pytest",
        "suites/test_checkpoint_strict.py",
        "-k",
        "test_non_strict_load_keeps_missing_and_ignores_unexpected and fsdp-full",
        "--strategy",
        "desync_strategies:barrier_on_rank_zero",
        "--hypothesis-profile=ci",
        "--nproc",
        "2",
        "-p",
        "no:cacheprovider",
        "--durations=1",
        "--durations-min=0",
        *extra,
    ]
    result = subprocess.run(
        command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    took = re.search(r"^([\d.]+)s call ", result.stdout, re.M)
    assert took is not None, result.stdout[-3000:]
    return result, float(took.group(1))


@pytest.mark.parametrize(
    "extra",
    [(), ("--check-collectives",)],
    ids=["default-settings-replay-checks", "checked-from-the-start"],
)
def test_barrier_on_one_rank_is_a_desync_under_ckpt_strict_2(extra: tuple[str, ...]) -> None:
    """By default the first run ends as a hang within seconds and its replay, with
    collectives checked, names the desync; ``--check-collectives`` names it at once."""
    result, took = _run_strict_two(*extra)
    out = result.stdout
    assert result.returncode == 1, out[-3000:]
    assert "FlakyFailure" not in out
    assert "CollectiveDesync: desync: the ranks entered collectives that do not match" in out
    barrier = r"rank 0 entered BARRIER at \S+desync_strategies\.py:\d+ in load_checkpoint"
    assert re.search(barrier, out)
    assert re.search(r"rank 1 entered (?!BARRIER)[A-Z_]+ ", out)  # the load's own collective
    assert "CKPT-STRICT-2    desync" in out  # a verdict of its own kind
    assert "@reproduce_failure(" in out  # the reproducer
    assert len(out.splitlines()) <= 320  # the coverage summary names the argument axes too
    assert "Captured rank" not in out  # rank warnings: one summary at the end instead
    if "Warning: " in out:
        assert out.index("= rank warnings summary =") > out.index("= FAILURES =")
    assert took <= 30, f"the check took {took:.1f} s"


def test_after_a_desync_the_next_checks_jobs_run_checked_from_the_start() -> None:
    from harness.run.session import current

    session = current()
    with pytest.raises(CollectiveDesync):
        run_on_ranks(all_reduce_other_shapes, world_size=2)
    assert session.desync_seen
    session.checked_check = None  # what the next check sees: not the check that desynced
    heals = len(session.heals)
    with pytest.raises(CollectiveDesync) as info:
        run_on_ranks(all_reduce_other_shapes, world_size=2)
    # checked from the start: named by the first run, no hang and no replay
    assert "replayed with collective checking" not in str(info.value)
    assert [h.cause for h in session.heals[heals:]] == ["broken group"]
    assert run_on_ranks(healthy_job, world_size=2) == [2.0, 2.0]  # checked, and healthy
