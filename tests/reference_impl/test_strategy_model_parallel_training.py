"""ModelParallelStrategy training: parity with the plain model, sharding layout, precision.

FSDP2 only (dp = world), tensor parallel only (tp = world) and 2x2 TP + FSDP2 with a
column/row-wise plan train like the unsharded model on the concatenated batch (TRAIN-1,
MP-2). Gathered parameters are read with ``get_model_state_dict(full_state_dict=True)``.
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from harness import max_world_size, run_on_ranks
from reference_impl.model_parallel import ModelParallelStrategy

DIM, HIDDEN, OUT, STEPS = 8, 16, 5, 3  # OUT=5: uneven FSDP shards, an empty one at dp=4
FULL = StateDictOptions(full_state_dict=True)


def case(world_size: int, *values: Any) -> Any:
    """Parameters of a job at ``world_size`` (skipped when ``--nproc`` is smaller)."""
    nproc = max_world_size()
    reason = f"environment: needs world size {world_size} but --nproc is {nproc}"
    marks = [pytest.mark.skip(reason=reason)] if world_size > nproc else []
    ident = "-".join(str(v) for v in (f"ws{world_size}", *values))
    return pytest.param(world_size, *values, marks=marks, id=ident)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w1 = nn.Linear(DIM, HIDDEN)
        self.w2 = nn.Linear(HIDDEN, DIM)
        self.norm = nn.LayerNorm(DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.w2(torch.nn.functional.gelu(self.w1(x))))


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block()])
        self.out = nn.Linear(DIM, OUT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.out(x)


def build(seed: int = 0) -> MLP:
    torch.manual_seed(seed)
    return MLP()


def parallelize(module: nn.Module, mesh: DeviceMesh, plan: str, policy: Any = None) -> nn.Module:
    """``tp``: w1 column-wise, w2 row-wise; ``fsdp``: fully_shard per block, then the root."""
    if "tp" in plan:
        for block in module.blocks:
            tp_plan = {"w1": ColwiseParallel(), "w2": RowwiseParallel()}
            parallelize_module(block, mesh["tensor_parallel"], tp_plan)
    if "fsdp" in plan:
        kwargs: dict[str, Any] = {"mesh": mesh["data_parallel"]}
        if policy is not None:
            kwargs["mp_policy"] = policy
        for block in module.blocks:
            fully_shard(block, **kwargs)
        fully_shard(module, **kwargs)
    return module


def optimizer_for(model: nn.Module) -> torch.optim.Optimizer:
    """AdamW with two parameter groups (blocks; output layer without weight decay)."""
    return torch.optim.AdamW(
        [
            {"params": list(model.blocks.parameters()), "lr": 1e-2},
            {"params": list(model.out.parameters()), "lr": 5e-3, "weight_decay": 0.0},
        ]
    )


def batch(step: int, dp_rank: int, dp_size: int, micro: int = 2) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(100 + step)
    x = torch.randn(dp_size * micro, 3, DIM, generator=gen)
    y = torch.randn(dp_size * micro, 3, OUT, generator=gen)
    rows = slice(dp_rank * micro, (dp_rank + 1) * micro)
    return x, y, x[rows], y[rows]


def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return (out.float() - target).pow(2).mean()


def rank_parity(ctx: Any, plan: str, dp: int, tp: int) -> dict[str, Any]:
    strategy = ModelParallelStrategy(
        functools.partial(parallelize, plan=plan),
        data_parallel_size=dp,
        tensor_parallel_size=tp,
        root_device=ctx.device,
    )
    strategy.setup_environment()
    model = strategy.setup_module(build())
    optimizer = strategy.setup_optimizer(optimizer_for(model))
    reference = build()
    ref_optimizer = optimizer_for(reference)
    _check_layout(model, plan)
    dp_rank = strategy.distributed_sampler_kwargs["rank"]
    losses, ref_losses = [], []
    for step in range(STEPS):
        x, y, my_x, my_y = batch(step, dp_rank, dp)
        with strategy.precision.forward_context():
            loss = loss_fn(model(strategy.precision.convert_input(my_x)), my_y)
        strategy.backward(loss, model)
        strategy.optimizer_step(optimizer)
        optimizer.zero_grad()
        losses.append(strategy.all_reduce(loss.detach(), reduce_op="mean"))
        ref_loss = loss_fn(reference(x), y)
        ref_loss.backward()
        ref_optimizer.step()
        ref_optimizer.zero_grad()
        ref_losses.append(ref_loss.detach())
    torch.testing.assert_close(torch.stack(losses), torch.stack(ref_losses), rtol=1e-5, atol=1e-6)
    gathered = get_model_state_dict(model, options=FULL)
    expected = reference.state_dict()
    assert list(gathered) == list(expected)
    for name, value in expected.items():
        torch.testing.assert_close(gathered[name], value, rtol=1e-4, atol=1e-5, msg=name)
    return dict(gathered)


def _check_layout(model: nn.Module, plan: str) -> None:
    """SHARD-1: fully_shard parameters are split on dim 0 over ``data_parallel``; the
    tensor-parallel ones carry their plan's placements."""
    for name, param in model.named_parameters():
        if "fsdp" in plan:
            assert isinstance(param, DTensor), name
            dp_dim = param.device_mesh.mesh_dim_names.index("data_parallel")
            placement = param.placements[dp_dim]  # Shard(0), or _StridedShard(0) under TP
            assert getattr(placement, "dim", None) == 0, (name, param.placements)
    if "tp" in plan:
        for block in model.blocks:
            w1, w2 = block.w1.weight, block.w2.weight
            assert w1.placements[-1] == Shard(0), w1.placements  # column-wise
            assert w2.placements[-1] == Shard(1), w2.placements  # row-wise


PARITY_CASES = [
    case(1, "fsdp", 1, 1),
    case(2, "fsdp", 2, 1),
    case(4, "fsdp", 4, 1),
    case(2, "tp", 1, 2),
    case(4, "tp", 1, 4),
    case(4, "tp+fsdp", 2, 2),
]


@pytest.mark.parametrize("world_size, plan, dp, tp", PARITY_CASES)
def test_parity_with_plain_model(world_size: int, plan: str, dp: int, tp: int) -> None:
    # TRAIN-1, TRAIN-3, MP-2, SHARD-1, SHARD-2
    results = run_on_ranks(rank_parity, plan, dp, tp, world_size=world_size)
    for result in results[1:]:  # gathered parameters are identical on every rank
        for name, value in results[0].items():
            assert torch.equal(result[name], value), name


# ---------------------------------------------------------------------- precision
LOW = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}


def rank_mixed_precision(ctx: Any, precision: str, plan: str, dp: int, tp: int) -> str:
    low = LOW[precision]
    policy = MixedPrecisionPolicy(param_dtype=low, reduce_dtype=low)
    strategy = ModelParallelStrategy(
        functools.partial(parallelize, plan=plan, policy=policy),
        data_parallel_size=dp,
        tensor_parallel_size=tp,
        precision=precision,
        root_device=ctx.device,
    )
    strategy.setup_environment()
    model = strategy.setup_module(build())
    optimizer = strategy.setup_optimizer(optimizer_for(model))
    if precision == "16-mixed":
        assert isinstance(strategy.precision.scaler, ShardedGradScaler)
    before = {k: v.clone() for k, v in get_model_state_dict(model, options=FULL).items()}
    for step in range(2):
        _, _, x, y = batch(step, strategy.distributed_sampler_kwargs["rank"], dp)
        with strategy.precision.forward_context():
            out = model(strategy.precision.convert_input(x))
            assert out.dtype == low
            loss = loss_fn(out, y)
        strategy.backward(loss, model)
        norm = strategy.clip_gradients_norm(model, optimizer, max_norm=10.0)
        assert 0 < norm < 100  # unscaled first: the 16-mixed loss scale is 65536
        strategy.optimizer_step(optimizer)
        optimizer.zero_grad()
    after = get_model_state_dict(model, options=FULL)
    assert any(not torch.equal(after[k], v) for k, v in before.items())  # it trained
    for param in model.parameters():  # PREC-2: master parameters and state stay float32
        assert param.dtype == torch.float32
        for value in optimizer.state[param].values():
            assert not value.is_floating_point() or value.dtype == torch.float32
    return str(out.dtype)


@pytest.mark.parametrize(
    "world_size, precision, plan, dp, tp",
    [
        case(2, "bf16-mixed", "fsdp", 2, 1),
        case(2, "16-mixed", "fsdp", 2, 1),
        case(2, "bf16-mixed", "tp", 1, 2),
    ],
)
def test_mixed_precision_trains_with_matching_policy(
    world_size: int, precision: str, plan: str, dp: int, tp: int
) -> None:  # PREC-2, API-4
    results = run_on_ranks(rank_mixed_precision, precision, plan, dp, tp, world_size=world_size)
    assert results == [str(LOW[precision])] * world_size


def rank_precision_checks(ctx: Any) -> bool:
    def strategy_for(precision: str, policy: Any) -> ModelParallelStrategy:
        fn = functools.partial(parallelize, plan="fsdp", policy=policy)
        s = ModelParallelStrategy(
            fn, ctx.world_size, 1, precision=precision, root_device=ctx.device
        )
        s.setup_environment()
        return s

    with pytest.raises(ValueError, match=r"precision='bf16-mixed'.*param_dtype=None"):
        strategy_for("bf16-mixed", None).setup_module(build())
    bf16_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"precision='32-true'.*param_dtype=torch.bfloat16"):
        strategy_for("32-true", bf16_policy).setup_module(build())
    with pytest.raises(ValueError, match=r"precision='16-mixed'.*param_dtype=torch.bfloat16"):
        strategy_for("16-mixed", bf16_policy).setup_module(build())

    true_bf16 = strategy_for("bf16-true", None)  # PREC-3
    with true_bf16.module_init_context(empty_init=False):
        created = build()
    assert all(p.dtype == torch.bfloat16 for p in created.parameters())
    for model in (true_bf16.setup_module(created), true_bf16.setup_module(build())):
        assert all(p.dtype == torch.bfloat16 for p in model.parameters())
        optimizer = true_bf16.setup_optimizer(
            torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        )
        _, _, x, y = batch(0, ctx.rank, ctx.world_size)
        with true_bf16.precision.forward_context():
            loss = loss_fn(model(true_bf16.precision.convert_input(x)), y)
        true_bf16.backward(loss, model)
        true_bf16.optimizer_step(optimizer)
        states = [s["momentum_buffer"] for s in optimizer.state.values()]
        assert states and all(s.dtype == torch.bfloat16 for s in states)
    return True


@pytest.mark.world_size(2)
def test_precision_policy_checks_and_true_modes(world_size: int) -> None:
    # PREC-2, PREC-3, CFG-10
    results = run_on_ranks(rank_precision_checks, world_size=world_size)
    assert results == [True] * world_size


# ---------------------------------------------------------------------- checkpoints (MP-3)
def _gathered(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    return {
        "model": dict(get_model_state_dict(model, options=FULL)),
        "optimizer": get_optimizer_state_dict(model, optimizer, options=FULL),
    }


def rank_checkpoint(ctx: Any, path: str, fmt: str, dp: int, tp: int, train: bool) -> dict:
    strategy = ctx.make_strategy(  # through the default factory, as the suites build it
        "model_parallel",
        parallelize_fn=functools.partial(parallelize, plan="tp+fsdp"),
        data_parallel_size=dp,
        tensor_parallel_size=tp,
        save_distributed_checkpoint=fmt == "sharded",
    )
    assert isinstance(strategy, ModelParallelStrategy)
    strategy.setup_environment()
    model = strategy.setup_module(build(seed=1 if train else 2))
    optimizer = strategy.setup_optimizer(optimizer_for(model))
    if train:
        for step in range(2):
            _, _, x, y = batch(step, strategy.distributed_sampler_kwargs["rank"], dp)
            strategy.backward(loss_fn(model(x), y), model)
            strategy.optimizer_step(optimizer)
            optimizer.zero_grad()
        strategy.save_checkpoint(path, {"model": model, "optimizer": optimizer, "step": 2})
        return _gathered(model, optimizer)
    state = {"model": model, "optimizer": optimizer, "step": 0}
    rest = strategy.load_checkpoint(path, state)
    assert state["step"] == 2 and rest == {}
    return _gathered(model, optimizer)


def _assert_same_state(actual: Any, expected: Any, where: str = "") -> None:
    if isinstance(expected, torch.Tensor):
        assert torch.equal(actual, expected), where
    elif isinstance(expected, dict):
        assert sorted(map(str, actual)) == sorted(map(str, expected)), where
        for key, value in expected.items():
            _assert_same_state(actual[key], value, f"{where}.{key}")
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected), where
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            _assert_same_state(a, e, f"{where}[{i}]")
    else:
        assert actual == expected, where


@pytest.fixture
def job_dir() -> Iterator[str]:
    """A directory that outlives jobs; not under pytest's basetemp, which concurrent pytest
    sessions of the same user prune (keeping 3) while this one may still use it."""
    path = tempfile.mkdtemp(prefix="shardcheck-mp-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.world_size(4)
@pytest.mark.parametrize("fmt", ["sharded", "full"])
def test_checkpoint_round_trip_and_reshard(fmt: str, job_dir: str) -> None:
    # MP-3, CKPT-RT-1/2/3 with DTensor (TP + FSDP2) parameters
    path = os.path.join(job_dir, "ckpt")
    saved = run_on_ranks(rank_checkpoint, path, fmt, 2, 2, True, world_size=4)
    assert os.path.isdir(path) is (fmt == "sharded")
    for dp, tp, world_size in [(2, 2, 4), (1, 2, 2), (2, 1, 2)]:
        loaded = run_on_ranks(rank_checkpoint, path, fmt, dp, tp, False, world_size=world_size)
        for result in loaded:
            _assert_same_state(result, saved[0], f"{fmt} at dp={dp} tp={tp}")
