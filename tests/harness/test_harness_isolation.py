"""One job's changes to process state do not reach the next job."""

from __future__ import annotations

import os
import random
import warnings

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d
from torch.distributed.device_mesh import init_device_mesh

from harness import RankContext, run_on_ranks
from harness.rank.isolation import COLLECT_EVERY

MARK = "SHARDCHECK_TEST_ISOLATION"


def pollute(ctx: RankContext) -> str:
    torch.set_default_dtype(torch.float64)
    os.environ[MARK] = "set by the previous job"
    os.environ.pop("PATH", None)
    os.chdir(ctx.tmp_dir)
    warnings.simplefilter("error")
    torch.set_grad_enabled(False)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(2)
    torch.manual_seed(1234 + ctx.rank)
    random.seed(99)
    np.random.seed(99)
    dist.new_group([0, 1])
    init_device_mesh("cpu", (2, ctx.world_size // 2), mesh_dim_names=("dp", "tp"))
    return os.getcwd()


def observe(ctx: RankContext) -> dict:
    warnings.warn("only a warning", UserWarning, stacklevel=1)  # would raise if "error" stuck
    return {
        "dtype": torch.get_default_dtype(),
        "mark": os.environ.get(MARK),
        "has_path": "PATH" in os.environ,
        "cwd": os.getcwd(),
        "grad": torch.is_grad_enabled(),
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "threads": torch.get_num_threads(),
        "torch_rand": torch.rand(2).tolist(),
        "py_rand": random.random(),
        "np_rand": float(np.random.rand()),
        "groups": len(c10d._world.pg_map),
        "group_count": c10d._world.group_count,
    }


def test_state_changes_do_not_leak_into_the_next_job() -> None:
    baseline = run_on_ranks(observe, world_size=4)
    job_dirs = run_on_ranks(pollute, world_size=4)
    after = run_on_ranks(observe, world_size=4)
    for rank, (before, now) in enumerate(zip(baseline, after, strict=True)):
        assert now["dtype"] == torch.float32
        assert now["mark"] is None
        assert now["has_path"]
        assert now["cwd"] == before["cwd"] != job_dirs[rank]
        assert now["grad"] is True
        assert now["deterministic"] is False
        assert now["threads"] == 1
        assert now["groups"] == 1  # only the default group: the subgroups were destroyed
        for key in ("torch_rand", "py_rand", "np_rand"):
            assert now[key] == before[key], key
    # every rank starts each job from the same seed
    assert len({tuple(r["torch_rand"]) for r in after}) == 1


def create_subgroup(ctx: RankContext) -> list[float]:
    group = dist.new_group([0, 1])
    t = torch.ones(1)
    dist.all_reduce(t, group=group)
    return t.tolist()


def test_new_subgroups_work_after_a_job_created_and_lost_one() -> None:
    for _ in range(3):
        assert run_on_ranks(create_subgroup, world_size=2) == [[2.0], [2.0]]


class _Cycle:
    """A job's object that holds a process group in a reference cycle (as modules, meshes
    and their hooks do)."""

    def __init__(self, group: object) -> None:
        self.group = group
        self.me = self


def group_in_a_cycle(ctx: RankContext) -> int:
    group = dist.new_group(list(range(ctx.world_size)))
    dist.all_reduce(torch.ones(1), group=group)
    _Cycle(group)  # dropped here: only a cyclic collection frees it
    return len(os.listdir("/proc/self/task"))


def test_groups_a_job_left_in_reference_cycles_are_freed_with_their_threads() -> None:
    jobs = 3 * COLLECT_EVERY
    counts = [run_on_ranks(group_in_a_cycle, world_size=2) for _ in range(jobs)]
    for rank in range(2):
        seen = [c[rank] for c in counts]
        # the dead groups of COLLECT_EVERY jobs at most are alive (3 threads each: gloo's two
        # workers and its TCP loop); without freeing them the count grows with every job
        bound = seen[0] + 3 * COLLECT_EVERY
        assert max(seen) <= bound, f"rank {rank}: threads per job {seen} grow past {bound}"
