"""Checkpoints of tensor-parallel + FSDP2 models on 2-D meshes whose sizes do not divide.

Saved at data-parallel 1 x tensor-parallel 2, loaded at 2 x 2: FSDP2 then shards the
tensor-parallel shard of ``up`` (2 rows over 2 tensor-parallel ranks: 1 row each) over 2
data-parallel ranks, ``_StridedShard(0, split_factor=2)`` with shards of 1 and 0 rows, the
case where torch's own full-state loader fails (see [Note: full state onto strided shards]
in ``reference_impl/checkpoint/local_shards.py``). The oracle is torch's
``get_model_state_dict``/``get_optimizer_state_dict`` with ``full_state_dict=True``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from harness import max_world_size, run_on_ranks
from reference_impl.checkpoint import load_checkpoint, save_checkpoint

pytestmark = pytest.mark.skipif(max_world_size() < 4, reason="needs 4 ranks")


class Mlp(nn.Module):
    """hidden=3, ffn=2, and a one-element parameter: no size divides the meshes used."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.up = nn.Linear(3, 2)
        self.down = nn.Linear(2, 3)
        self.gate = nn.Parameter(torch.randn(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x))) * self.gate


def build(dp: int, tp: int, seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
    model = Mlp(seed)
    parallelize_module(model, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
    return model, torch.optim.Adam(model.parameters(), lr=0.1)


def gathered(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    options = StateDictOptions(full_state_dict=True)
    return {
        "model": get_model_state_dict(model, options=options),
        "optimizer": get_optimizer_state_dict(model, opt, options=options),
    }


def rank_save(ctx: Any, out: str) -> None:
    model, opt = build(1, 2, seed=0)
    torch.manual_seed(100)  # the same batch on both tensor-parallel ranks
    model(torch.randn(4, 3)).square().sum().backward()
    opt.step()
    state = {"model": model, "optimizer": opt}
    save_checkpoint(Path(out) / "full.pt", state, full=True)
    save_checkpoint(Path(out) / "sharded", state, full=False)
    expected = gathered(model, opt)  # a collective: every rank reads it
    if ctx.rank == 0:
        torch.save(expected, Path(out) / "expected.pt")


def rank_load(ctx: Any, out: str) -> list[str]:
    expected = torch.load(Path(out) / "expected.pt", weights_only=True)
    placements = []
    for name in ("full.pt", "sharded"):
        model, opt = build(2, 2, seed=1)
        load_checkpoint(Path(out) / name, {"model": model, "optimizer": opt}, strict=True)
        actual = gathered(model, opt)
        for key, value in expected["model"].items():
            assert torch.equal(actual["model"][key], value), f"{name}: {key}"
        for key, values in expected["optimizer"]["state"].items():
            for field, value in values.items():
                got = actual["optimizer"]["state"][key][field]
                assert torch.equal(got, value), f"{name}: optimizer {key}.{field}"
        up = model.up.weight
        assert isinstance(up, DTensor)
        placements.append(f"{up.placements}:{tuple(up.to_local().shape)}")
    return placements


def test_full_and_sharded_load_into_an_uneven_two_by_two_mesh(tmp_path: Path) -> None:
    run_on_ranks(rank_save, str(tmp_path), world_size=2)
    placements = run_on_ranks(rank_load, str(tmp_path), world_size=4)
    # the case under test: up.weight strided-sharded, 1 row on dp rank 0, none on dp rank 1
    strided = [p[0] for p in placements]
    assert all("_StridedShard(dim=0, sf=2)" in p for p in strided), strided
    assert [p.rsplit(":", 1)[1] for p in strided] == ["(1, 3)", "(1, 3)", "(0, 3)", "(0, 3)"]
