"""FSDP2's collectives in hang verdicts: named from a rank's stack (unit tests on dumps as
torch 2.13 writes them), and a rank left alone in FSDP2's all-gather (real ranks)."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

from harness import RankContext, run_on_ranks
from harness.verdicts.collectives import waiting_collective
from harness.verdicts.failures import CollectiveHang

TORCH = os.path.dirname(torch.__file__)
FSDP2 = os.path.join(TORCH, "distributed", "fsdp", "_fully_shard")
C10D = os.path.join(TORCH, "distributed", "distributed_c10d.py")
LOGGER = os.path.join(TORCH, "distributed", "c10d_logger.py")


def _dump(*frames: tuple[str, int, str]) -> str:
    lines = [f'  File "{file}", line {line} in {name}' for file, line, name in frames]
    return "Thread 0x00007f2395be4b80 (most recent call first):\n" + "\n".join(lines) + "\n"


def _fsdp2(module: str, line: int, name: str) -> tuple[str, int, str]:
    return (os.path.join(FSDP2, f"{module}.py"), line, name)


def test_a_rank_in_fsdp2s_forward_all_gather_is_named_with_its_hook() -> None:
    # what rank 0 dumped, waiting in the root's all-gather while rank 1 skipped the forward
    stacks = _dump(
        (C10D, 4394, "all_gather_single"),
        (LOGGER, 83, "wrapper"),
        _fsdp2("_fsdp_collectives", 119, "__call__"),
        _fsdp2("_fsdp_collectives", 364, "foreach_all_gather"),
        _fsdp2("_fsdp_param_group", 407, "unshard"),
        _fsdp2("_fsdp_common", 43, "wrapper"),
        _fsdp2("_fsdp_param_group", 551, "pre_forward"),
        _fsdp2("_fsdp_state", 314, "_pre_forward"),
        (os.path.join(TORCH, "nn", "modules", "module.py"), 1884, "_call_impl"),
        ("/home/me/strategy.py", 30, "training_step"),
    )
    found = waiting_collective(stacks)
    assert found is not None
    assert found.op == "all_gather_single"  # the c10d call: a verdict's signature keeps it
    assert found.frame == "/home/me/strategy.py:30 in training_step"
    assert found.describe() == (
        "FSDP2 all-gather (foreach_all_gather in pre_forward; c10d all_gather_single) "
        "at /home/me/strategy.py:30 in training_step"
    )


def test_a_rank_in_fsdp2s_gradient_reduce_scatter_is_named() -> None:
    stacks = _dump(
        (C10D, 4943, "reduce_scatter_single"),
        (LOGGER, 83, "wrapper"),
        _fsdp2("_fsdp_collectives", 184, "__call__"),
        _fsdp2("_fsdp_collectives", 619, "foreach_reduce"),
        _fsdp2("_fsdp_param_group", 688, "post_backward"),
        _fsdp2("_fsdp_state", 415, "_root_post_backward_final_callback"),
        (os.path.join(TORCH, "autograd", "graph.py"), 979, "_engine_run_backward"),
        ("/home/me/strategy.py", 41, "backward"),
    )
    found = waiting_collective(stacks)
    assert found is not None and found.op == "reduce_scatter_single"
    assert found.via == (
        "FSDP2 reduce-scatter (foreach_reduce in post_backward; c10d reduce_scatter_single)"
    )
    # HSDP: the replicas' all-reduce inside foreach_reduce
    hsdp = stacks.replace("4943 in reduce_scatter_single", "2950 in all_reduce")
    found = waiting_collective(hsdp)
    assert found is not None and found.via.startswith("FSDP2 all-reduce (foreach_reduce")


def test_a_rank_waiting_for_an_issued_all_gather_is_in_a_collective() -> None:
    # an all-gather issued with async_op (NCCL) is waited for with no c10d frame on the stack
    stacks = _dump(
        _fsdp2("_fsdp_collectives", 449, "foreach_all_gather_copy_out"),
        (os.path.join(TORCH, "utils", "_contextlib.py"), 124, "decorate_context"),
        _fsdp2("_fsdp_param_group", 463, "wait_for_unshard"),
        _fsdp2("_fsdp_param_group", 552, "pre_forward"),
        ("/home/me/strategy.py", 30, "training_step"),
    )
    found = waiting_collective(stacks)
    assert found is not None
    assert found.op == "foreach_all_gather_copy_out"
    assert found.describe() == (
        "FSDP2 all-gather (foreach_all_gather_copy_out in pre_forward) "
        "at /home/me/strategy.py:30 in training_step"
    )
    # FSDP2's other frames, not waiting (computing in its own copy, the strategy's code
    # innermost) are no collective: the rank works, it does not wait
    busy = _dump(
        _fsdp2("_fsdp_param", 700, "init_unsharded_param"),
        _fsdp2("_fsdp_param_group", 470, "wait_for_unshard"),
        ("/home/me/strategy.py", 30, "training_step"),
    )
    assert waiting_collective(busy) is None
    inside = _dump(
        ("/home/me/hook.py", 3, "on_wait"),
        _fsdp2("_fsdp_collectives", 449, "foreach_all_gather_copy_out"),
    )
    assert waiting_collective(inside) is None


def _fsdp2_model(ctx: RankContext) -> nn.Module:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (ctx.world_size,))
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def forward_on_rank_zero_only(ctx: RankContext) -> int:
    model = _fsdp2_model(ctx)
    if ctx.rank == 0:
        model(torch.ones(2, 4))  # the bug: rank 1 skips the step, rank 0 all-gathers alone
    return ctx.rank


@pytest.mark.world_size(2)
def test_a_rank_alone_in_fsdp2s_all_gather_reads_hang_naming_it() -> None:
    with pytest.raises(CollectiveHang) as info:
        run_on_ranks(forward_on_rank_zero_only, world_size=2)
    waiting, finished = info.value.outcomes
    assert finished.ok and finished.value == 1
    assert waiting.kind == "hung" and "after rank 1 finished" in waiting.detail
    assert waiting.collective is not None
    assert waiting.collective.via.startswith("FSDP2 all-gather (foreach_all_gather in pre_forward")
    assert "forward_on_rank_zero_only" in waiting.collective.frame
    message = str(info.value)
    assert "rank(s) 1 finished the job while the others still wait in it" in message
    assert "rank 0 waits in FSDP2 all-gather (foreach_all_gather in pre_forward" in message
