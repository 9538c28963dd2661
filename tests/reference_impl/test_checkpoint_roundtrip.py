"""Checkpoint round trips through reference_impl.checkpoint, for FSDP1, FSDP2 and TP.

Expected state is always read with torch's ``get_model_state_dict``/``get_optimizer_state_dict``
(``full_state_dict=True``), never with the checkpoint code under test. Models are wrapped
with raw FSDP1/``fully_shard`` so these tests do not depend on the strategies.
"""

from __future__ import annotations

import subprocess
import sys
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
from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard
from torch.distributed.fsdp.wrap import ModuleWrapPolicy
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)

from harness import run_on_ranks
from reference_impl.checkpoint import (
    convert_sharded_to_full,
    load_checkpoint,
    save_checkpoint,
    to_standard_optimizer_state,
)

REPO = Path(__file__).resolve().parents[2]
FAMILIES = ("fsdp1", "fsdp1_flat", "fsdp2")


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


class Frozen(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.lin = nn.Linear(width, width)
        self.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


class Net(nn.Module):
    """Uneven sizes, persistent and non-persistent buffers, never-used, frozen and tied
    parameters (18 state keys)."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Linear(6, 10)
        self.blocks = nn.ModuleList([Block(10), Block(10)])
        self.head = nn.Linear(10, 3)
        self.tied_a = nn.Linear(3, 3, bias=False)
        self.tied_b = nn.Linear(3, 3, bias=False)
        self.tied_b.weight = self.tied_a.weight
        self.frozen = Frozen(3)
        self.unused = nn.Parameter(torch.randn(7))
        self.register_buffer("scale", torch.rand(3) + 0.5)
        self.register_buffer("cache", torch.zeros(3), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        y = self.head(h) * self.scale
        y = self.tied_b(torch.tanh(self.tied_a(y)))
        return y + self.frozen(y)


def shard(model: Net, family: str, world_size: int) -> nn.Module:
    """Wrap ``model`` with raw FSDP1, FSDP2, or TP+FSDP2 (family "tp", 2-D mesh)."""
    if family.startswith("fsdp1"):
        return FullyShardedDataParallel(
            model,
            device_id=torch.device("cpu"),
            auto_wrap_policy=ModuleWrapPolicy({Block, Frozen}),
            use_orig_params=family == "fsdp1",
        )
    if family == "tp":
        mesh = init_device_mesh("cpu", (world_size // 2, 2), mesh_dim_names=("dp", "tp"))
        for block in model.blocks:
            plan = {"up": ColwiseParallel(), "down": RowwiseParallel()}
            parallelize_module(block, mesh["tp"], plan)
            fully_shard(block, mesh=mesh["dp"])
        fully_shard(model, mesh=mesh["dp"])
        return model
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model.frozen)
    fully_shard(model)
    return model


def make_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    """Adam with two parameter groups; the head's group comes first."""
    named = list(model.named_parameters())
    blocks = [p for n, p in named if "blocks" in n]
    rest = [p for n, p in named if "blocks" not in n]
    return torch.optim.Adam(
        [{"params": rest, "lr": 2e-2, "weight_decay": 0.1}, {"params": blocks, "lr": 1e-2}]
    )


def build(family: str, world_size: int, seed: int = 0) -> tuple[nn.Module, torch.optim.Optimizer]:
    model = shard(Net(seed), family, world_size)
    return model, make_optimizer(model)


def train(
    model: nn.Module, opt: torch.optim.Optimizer, rank: int, steps: int = 2, seed: int = 100
) -> None:
    gen = torch.Generator().manual_seed(seed + rank)
    for _ in range(steps):
        model(torch.randn(4, 6, generator=gen)).sum().backward()
        opt.step()
        opt.zero_grad()


def gathered(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    """The oracle: torch's own full state dict readers."""
    options = StateDictOptions(full_state_dict=True)
    return {
        "model": get_model_state_dict(model, options=options),
        "optimizer": get_optimizer_state_dict(model, opt, options=options),
    }


def assert_same(actual: Any, expected: Any, path: str = "state") -> None:
    """Bitwise equality of nested state, naming the first difference."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{path}: {type(actual)} is not a tensor"
        assert actual.dtype == expected.dtype, f"{path}: dtype {actual.dtype} != {expected.dtype}"
        assert torch.equal(actual.cpu(), expected.cpu()), f"{path}: values differ"
    elif isinstance(expected, dict):
        assert isinstance(actual, dict), f"{path}: {type(actual)} is not a dict"
        assert sorted(map(str, actual)) == sorted(map(str, expected)), f"{path}: keys differ"
        for key in expected:
            assert_same(actual[key], expected[key], f"{path}.{key}")
    elif isinstance(expected, (list, tuple)):
        assert type(actual) is type(expected), f"{path}: {type(actual)} != {type(expected)}"
        assert len(actual) == len(expected), f"{path}: length {len(actual)} != {len(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert_same(a, e, f"{path}[{i}]")
    else:
        assert actual == expected, f"{path}: {actual!r} != {expected!r}"


def data_rank(ctx: Any, family: str) -> int:
    """Tensor-parallel peers share their batch (mesh (dp, tp) with tp=2)."""
    return ctx.rank // 2 if family == "tp" else ctx.rank


def rank_round_trip(ctx: Any, family: str, formats: list[bool]) -> int:
    """Save, load into fresh objects: equal state; one more step each: equal again (resume)."""
    model, opt = build(family, ctx.world_size)
    train(model, opt, data_rank(ctx, family))
    expected = gathered(model, opt)
    resumed = []
    for full in formats:
        path = Path(ctx.tmp_dir) / ("ckpt.pt" if full else "ckpt")
        save_checkpoint(path, {"model": model, "optimizer": opt, "step": 2}, full=full)
        fresh, fresh_opt = build(family, ctx.world_size, seed=1)
        state = {"model": fresh, "optimizer": fresh_opt, "step": 0}
        assert load_checkpoint(path, state, strict=True) == {}
        assert state["step"] == 2
        assert_same(gathered(fresh, fresh_opt), expected, f"full={full}")
        assert "cache" not in get_model_state_dict(fresh)  # non-persistent: not saved
        train(fresh, fresh_opt, data_rank(ctx, family), steps=1, seed=200)
        resumed.append(gathered(fresh, fresh_opt))
    train(model, opt, data_rank(ctx, family), steps=1, seed=200)
    for full, state in zip(formats, resumed, strict=True):
        assert_same(state, gathered(model, opt), f"resumed full={full}")
    return len(expected["model"])


def rank_never_stepped(ctx: Any) -> None:
    """Saving an optimizer that never stepped neither changes it nor invents state."""
    for family in ("fsdp1_flat", "fsdp2"):
        for full in (True, False):
            model, opt = build(family, ctx.world_size)
            path = Path(ctx.tmp_dir) / f"{family}-{full}"
            save_checkpoint(path, {"model": model, "optimizer": opt}, full=full)
            assert not opt.state, family
            fresh, fresh_opt = build(family, ctx.world_size, seed=1)
            load_checkpoint(path, {"model": fresh, "optimizer": fresh_opt}, strict=True)
            assert not fresh_opt.state, f"{family} full={full}: state appeared on load"
            train(model, opt, ctx.rank, steps=1)
            train(fresh, fresh_opt, ctx.rank, steps=1)
            assert_same(gathered(fresh, fresh_opt), gathered(model, opt), f"{family} {full}")


def test_never_stepped_optimizer_round_trips() -> None:
    """CKPT-STRICT-3 and CKPT-RT-5 for an optimizer without state."""
    run_on_ranks(rank_never_stepped, world_size=2)


@pytest.mark.parametrize("full", [True, False], ids=["full", "sharded"])
@pytest.mark.parametrize("family", FAMILIES)
def test_round_trip_is_bitwise(family: str, full: bool) -> None:
    """CKPT-RT-1/2, CKPT-STRICT-3 (groups, never-stepped parameter), CKPT-BUF-1."""
    assert run_on_ranks(rank_round_trip, family, [full], world_size=2) == [18, 18]


def test_round_trip_tensor_parallel() -> None:
    """MP-3: both formats with TP + FSDP2 (DTensor) parameters, in one job."""
    assert run_on_ranks(rank_round_trip, "tp", [True, False], world_size=4) == [18] * 4


def rank_save_all(ctx: Any, family: str, out: str) -> None:
    model, opt = build(family, ctx.world_size)
    train(model, opt, ctx.rank)
    expected = gathered(model, opt)
    meta = {"step": 2, "note": "hello", "lrs": [0.1, torch.tensor([1.0, 2.0])]}
    save_checkpoint(Path(out) / "full.pt", {"model": model, "optimizer": opt, **meta}, full=True)
    save_checkpoint(Path(out) / "sharded", {"model": model, "optimizer": opt, **meta}, full=False)
    if ctx.rank == 0:
        torch.save({**expected, **meta}, Path(out) / "expected.pt")


def rank_load_all(ctx: Any, family: str, out: str, names: list[str]) -> None:
    expected = torch.load(Path(out) / "expected.pt", weights_only=True)
    for name in names:
        model, opt = build(family, ctx.world_size, seed=1)
        state = {"model": model, "optimizer": opt, "step": 0}
        rest = load_checkpoint(Path(out) / name, state, strict=True)
        assert state["step"] == 2, name
        assert_same(rest, {"note": "hello", "lrs": expected["lrs"]}, f"{name} rest")
        assert_same(gathered(model, opt), {k: expected[k] for k in ("model", "optimizer")}, name)
        if name == "full.pt":  # a full checkpoint loaded and saved sharded (CKPT-RT-4)
            save_checkpoint(Path(out) / "resaved", state, full=False)


@pytest.mark.parametrize(
    ("save", "load"),
    [(("fsdp1", 4), ("fsdp2", 2)), (("fsdp2", 2), ("fsdp1_flat", 4))],
    ids=["fsdp1@4->fsdp2@2", "fsdp2@2->fsdp1flat@4"],
)
def test_reshard_cross_family_and_convert(tmp_path: Path, save: tuple, load: tuple) -> None:
    run_on_ranks(rank_save_all, save[0], str(tmp_path), world_size=save[1])
    # offline conversion in this (controller) process: no process group exists here
    written = convert_sharded_to_full(tmp_path / "sharded", tmp_path / "converted.pt")
    expected = torch.load(tmp_path / "expected.pt", weights_only=True)
    assert_same(written, expected, "converted")
    assert_same(torch.load(tmp_path / "full.pt", weights_only=True), expected, "full.pt")
    # the command line does the same
    cli = subprocess.run(
        [
            sys.executable,
            "-m",
            "reference_impl.convert",
            str(tmp_path / "sharded"),
            str(tmp_path / "cli.pt"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert cli.returncode == 0, cli.stderr
    assert "cli.pt" in cli.stdout
    assert_same(torch.load(tmp_path / "cli.pt", weights_only=True), expected, "cli.pt")
    # the full file loads into the plain model and a plain optimizer (CKPT-REKEY-2)
    plain = Net(seed=3)
    plain.load_state_dict(expected["model"], strict=True)
    plain_opt = make_optimizer(plain)
    plain_opt.load_state_dict(to_standard_optimizer_state(expected["optimizer"]))
    names = {param: name for name, param in plain.named_parameters()}
    for param, values in plain_opt.state.items():
        assert_same(dict(values), expected["optimizer"]["state"][names[param]], names[param])
    names_to_load = ["full.pt", "sharded", "converted.pt"]
    run_on_ranks(rank_load_all, load[0], str(tmp_path), names_to_load, world_size=load[1])
    resaved = convert_sharded_to_full(tmp_path / "resaved", tmp_path / "resaved.pt")
    assert_same(resaved, {k: expected[k] for k in ("model", "optimizer", "step")}, "resaved")


def rank_load_sharded_at(ctx: Any, family: str, out: str) -> None:
    rank_load_all(ctx, family, out, ["sharded"])


def test_sharded_reshard_4_to_2_same_family(tmp_path: Path) -> None:
    run_on_ranks(rank_save_all, "fsdp1_flat", str(tmp_path), world_size=4)
    run_on_ranks(rank_load_sharded_at, "fsdp1_flat", str(tmp_path), world_size=2)
