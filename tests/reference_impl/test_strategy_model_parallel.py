"""ModelParallelStrategy: construction, mesh, setup errors, sync control, clipping, meta init.

Training parity and precision live in ``test_strategy_model_parallel_training.py``. Every
multi-rank check asserts inside the rank (``pytest.raises`` included) and returns what the
controller compares across ranks. Expected values come from the plain model and torch's own
readers (``get_model_state_dict``, ``DTensor.full_tensor``), never the strategy's save.
"""

from __future__ import annotations

import functools
import math
import zlib
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from harness import max_world_size, run_on_ranks
from reference_impl.model_parallel import ModelParallelStrategy

VOCAB, DIM, HIDDEN = 6, 8, 16  # VOCAB=6 leaves a rank with an empty FSDP shard at dp=4
FULL = StateDictOptions(full_state_dict=True)


def case(world_size: int, *values: Any) -> Any:
    """Parameters of a job at ``world_size`` (skipped when ``--nproc`` is smaller)."""
    nproc = max_world_size()
    reason = f"environment: needs world size {world_size} but --nproc is {nproc}"
    marks = [pytest.mark.skip(reason=reason)] if world_size > nproc else []
    ident = "-".join(str(v) for v in (f"ws{world_size}", *values))
    return pytest.param(world_size, *values, marks=marks, id=ident)


# ---------------------------------------------------------------------- the model
def _fill(param: torch.Tensor, seed: int) -> None:
    """Write a seeded full tensor into ``param`` (its shard, for a DTensor)."""
    gen = torch.Generator().manual_seed(seed)
    full = (0.3 * torch.randn(param.shape, generator=gen)).to(param.dtype)
    with torch.no_grad():
        if isinstance(param, DTensor):
            param.copy_(distribute_tensor(full, param.device_mesh, param.placements))
        else:
            param.copy_(full)


class _Seeded:
    """Mixin: ``reset_parameters`` seeds itself from the module's qualified name."""

    qualname: str
    resets: int

    def _seed(self, slot: str) -> int:
        return zlib.crc32(f"{self.qualname}.{slot}".encode())


class SeededLinear(nn.Linear, _Seeded):
    def __init__(self, qualname: str, n_in: int, n_out: int, bias: bool = True) -> None:
        self.qualname, self.resets, self.skip_weight = qualname, 0, False
        super().__init__(n_in, n_out, bias=bias)

    def reset_parameters(self) -> None:
        self.resets += 1
        if not self.skip_weight:  # a tied head leaves the shared weight to its owner
            _fill(self.weight, self._seed("weight"))
        if self.bias is not None:
            _fill(self.bias, self._seed("bias"))


class SeededEmbedding(nn.Embedding, _Seeded):
    def __init__(self, qualname: str, num: int, dim: int) -> None:
        self.qualname, self.resets = qualname, 0
        super().__init__(num, dim)

    def reset_parameters(self) -> None:
        self.resets += 1
        _fill(self.weight, self._seed("weight"))


class Offset(nn.Module, _Seeded):
    """A persistent buffer used in the forward pass and a non-persistent counter."""

    def __init__(self, qualname: str, dim: int) -> None:
        super().__init__()
        self.qualname, self.resets = qualname, 0
        self.register_buffer("offset", torch.empty(dim))
        self.register_buffer("calls", torch.empty(()), persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        self.resets += 1
        with torch.no_grad():
            self.offset.copy_(torch.linspace(-0.5, 0.5, self.offset.numel()))
            self.calls.fill_(0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.offset


class Block(nn.Module):
    def __init__(self, qualname: str) -> None:
        super().__init__()
        self.w1 = SeededLinear(f"{qualname}.w1", DIM, HIDDEN)
        self.w2 = SeededLinear(f"{qualname}.w2", HIDDEN, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.w2(torch.relu(self.w1(x)))


class Net(nn.Module):
    """ids -> embedding -> 2 residual MLP blocks -> offset -> head (optionally tied)."""

    def __init__(self, tied: bool = False) -> None:
        super().__init__()
        self.embed = SeededEmbedding("embed", VOCAB, DIM)
        self.blocks = nn.ModuleList([Block(f"blocks.{i}") for i in range(2)])
        self.offset = Offset("offset", DIM)
        self.head = SeededLinear("head", DIM, VOCAB, bias=False)
        if tied:
            self.head.skip_weight = True
            self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(self.offset(x))


def parallelize(module: nn.Module, mesh: DeviceMesh, plan: str, mp_policy: Any = None) -> nn.Module:
    """``tp``: column/row-wise plan per block; ``fsdp``: fully_shard per block and root."""
    if "tp" in plan:
        for block in getattr(module, "blocks", []):
            plan_ = {"w1": ColwiseParallel(), "w2": RowwiseParallel()}
            parallelize_module(block, mesh["tensor_parallel"], plan_)
    if "fsdp" in plan:
        kwargs = {"mesh": mesh["data_parallel"]}
        if mp_policy is not None:
            kwargs["mp_policy"] = mp_policy
        for block in getattr(module, "blocks", []):
            fully_shard(block, **kwargs)
        fully_shard(module, **kwargs)
    return module


def make_strategy(ctx: Any, plan: str, dp: int, tp: int, **kwargs: Any) -> ModelParallelStrategy:
    strategy = ModelParallelStrategy(
        functools.partial(parallelize, plan=plan, mp_policy=kwargs.pop("mp_policy", None)),
        data_parallel_size=dp,
        tensor_parallel_size=tp,
        root_device=ctx.device,
        **kwargs,
    )
    strategy.setup_environment()
    return strategy


def batch(step: int, dp_rank: int, dp_size: int, micro: int = 2) -> tuple[torch.Tensor, ...]:
    """Step ``step``'s global batch (``dp_size * micro`` rows) and this rank's slice."""
    gen = torch.Generator().manual_seed(1000 + step)
    ids = torch.randint(0, VOCAB, (dp_size * micro, 3), generator=gen)
    target = torch.randn(dp_size * micro, 3, VOCAB, generator=gen)
    rows = slice(dp_rank * micro, (dp_rank + 1) * micro)
    return ids, target, ids[rows], target[rows]


def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return (out.float() - target).pow(2).mean()


def full_grads(module: nn.Module) -> dict[str, torch.Tensor]:
    return {
        name: (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).clone()
        for name, p in module.named_parameters()
        if p.grad is not None
    }


# ---------------------------------------------------------------------- single process
def test_construction_validates_arguments() -> None:
    fn = functools.partial(parallelize, plan="fsdp")
    with pytest.raises(TypeError, match=r"parallelize_fn=.*callable"):
        ModelParallelStrategy("not a function")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"data_parallel_size='two'.*\"auto\" or a positive int"):
        ModelParallelStrategy(fn, data_parallel_size="two")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"tensor_parallel_size=2.0"):
        ModelParallelStrategy(fn, tensor_parallel_size=2.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"tensor_parallel_size=0.*at least 1"):
        ModelParallelStrategy(fn, tensor_parallel_size=0)
    with pytest.raises(TypeError, match=r"save_distributed_checkpoint='yes'.*bool"):
        ModelParallelStrategy(fn, save_distributed_checkpoint="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="precision='64-true'"):
        ModelParallelStrategy(fn, precision="64-true")


def test_device_mesh_before_setup_environment_raises() -> None:  # MP-1
    strategy = ModelParallelStrategy(functools.partial(parallelize, plan="fsdp"))
    with pytest.raises(RuntimeError, match="setup_environment"):
        _ = strategy.device_mesh
    with pytest.raises(RuntimeError, match="setup_environment"):
        _ = strategy.distributed_sampler_kwargs


@pytest.mark.parametrize("distributed, full", [(True, False), (False, True)])
def test_checkpoint_format_follows_save_distributed_checkpoint(
    distributed: bool, full: bool
) -> None:
    strategy = ModelParallelStrategy(
        functools.partial(parallelize, plan="fsdp"), save_distributed_checkpoint=distributed
    )
    assert strategy._full_checkpoint is full  # MP-3: True -> sharded, False -> full


# ---------------------------------------------------------------------- mesh and errors
def rank_mesh_and_config_errors(ctx: Any) -> dict[str, Any]:
    ws = ctx.world_size
    auto = ModelParallelStrategy(functools.partial(parallelize, plan="tp"), root_device=ctx.device)
    auto.setup_environment()
    mesh = auto.device_mesh
    assert mesh.device_type == ctx.device.type
    result = {
        "names": mesh.mesh_dim_names,
        "shape": tuple(mesh.shape),
        "auto_sampler": auto.distributed_sampler_kwargs,
    }
    dp_only = make_strategy(ctx, "fsdp", dp=ws, tp=1)
    result["dp_sampler"] = dp_only.distributed_sampler_kwargs
    bad = ModelParallelStrategy(
        functools.partial(parallelize, plan="fsdp"),
        data_parallel_size=ws,
        tensor_parallel_size=2,
        root_device=ctx.device,
    )
    match = rf"data_parallel_size={ws}.*tensor_parallel_size=2.*world size \({ws}\)"
    with pytest.raises(RuntimeError, match=match):  # CFG-8
        bad.setup_environment()
    auto.teardown()  # API-8: the caller's default group survives; the mesh is gone
    assert dist.is_initialized() and dist.get_world_size() == ws
    with pytest.raises(RuntimeError, match="setup_environment"):
        _ = auto.device_mesh
    return result


@pytest.mark.world_size(1, 2, 4)
def test_mesh_names_sizes_and_sampler(world_size: int) -> None:  # CFG-8, MP-1, API-6
    results = run_on_ranks(rank_mesh_and_config_errors, world_size=world_size)
    for rank, result in enumerate(results):
        assert result["names"] == ("data_parallel", "tensor_parallel")
        assert result["shape"] == (1, world_size)  # auto on one machine: dp=1, tp=world
        assert result["auto_sampler"] == {"num_replicas": 1, "rank": 0}
        assert result["dp_sampler"] == {"num_replicas": world_size, "rank": rank}


class _ReturnsNothing:
    def __call__(self, module: nn.Module, mesh: DeviceMesh) -> None:
        return None


class NoReset(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(4))


def rank_setup_errors(ctx: Any) -> bool:
    strategy = make_strategy(ctx, "fsdp", dp=ctx.world_size, tp=1)
    wrapped = nn.Sequential(FullyShardedDataParallel(nn.Linear(4, 4), device_id=ctx.device))
    with pytest.raises(TypeError, match=r"FullyShardedDataParallel \(FSDP1\).*'0'"):  # CFG-9
        strategy.setup_module(wrapped)
    returns_none = ModelParallelStrategy(_ReturnsNothing(), root_device=ctx.device)
    returns_none.setup_environment()
    with pytest.raises(TypeError, match=r"must return an nn.Module.*returned NoneType"):  # CFG-9
        returns_none.setup_module(Net())
    plain = Net()
    early = torch.optim.AdamW(plain.parameters())
    strategy.setup_module(plain)
    with pytest.raises(ValueError, match="Create the optimizer after setup_module"):  # API-2
        strategy.setup_optimizer(early)
    fresh = Net()
    with pytest.raises(ValueError, match=r"Call setup_module\(module\) first"):
        strategy.setup_module_and_optimizers(fresh, [torch.optim.SGD(fresh.parameters())])
    assert not isinstance(fresh.embed.weight, DTensor)  # refused before anything was set up
    model, optimizers = strategy.setup_module_and_optimizers(fresh, [])
    assert optimizers == [] and isinstance(model.embed.weight, DTensor)
    if ctx.world_size > 1:
        tp_only = make_strategy(ctx, "tp", dp=ctx.world_size, tp=1)
        with pytest.raises(ValueError, match=r"data_parallel_size=\d.*no FSDP2 fully_shard"):
            tp_only.setup_module(Net())
    with strategy.module_init_context(empty_init=True):
        no_reset = nn.Sequential(NoReset(), nn.Linear(2, 2))
    with pytest.raises(TypeError, match=r"define no reset_parameters\(\): '0'"):
        strategy.setup_module(no_reset)
    return True


@pytest.mark.world_size(1, 2)
def test_setup_errors(world_size: int) -> None:  # CFG-9, API-2, API-3
    assert run_on_ranks(rank_setup_errors, world_size=world_size) == [True] * world_size


# ---------------------------------------------------------------------- no_backward_sync
def _sync_flags(module: nn.Module) -> list[tuple[bool, bool]]:
    return [
        (group.reduce_grads, group.all_reduce_grads)
        for mod in module.modules()
        if hasattr(mod, "_get_fsdp_state")
        for group in mod._get_fsdp_state()._fsdp_param_groups
    ]


def rank_no_backward_sync(ctx: Any, plan: str, dp: int, tp: int) -> dict[str, Any]:
    strategy = make_strategy(ctx, plan, dp=dp, tp=tp)
    model = strategy.setup_module(Net())
    reference = Net()
    sampler = strategy.distributed_sampler_kwargs
    dp_rank, dp_size = sampler["rank"], sampler["num_replicas"]
    # two micro-batches per rank: the first without sync, then one synced backward (SYNC-1)
    ids, target, *_ = batch(0, 0, 1, micro=4 * dp_size)
    loss_fn(reference(ids), target).backward()
    for micro in range(2):
        rows = slice((2 * dp_rank + micro) * 2, (2 * dp_rank + micro + 1) * 2)
        ctx_ = strategy.no_backward_sync(model, enabled=micro == 0)
        with ctx_:
            (loss_fn(model(ids[rows]), target[rows]) / 2).backward()
    grads, expected = full_grads(model), full_grads(reference)
    for name, grad in expected.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)

    model.blocks[0].set_requires_gradient_sync(False, recurse=False)  # a user's own setting
    before = _sync_flags(model)
    with pytest.raises(ZeroDivisionError):  # MP-4: restored when the body raises
        with strategy.no_backward_sync(model, enabled=True):
            assert not any(flag for pair in _sync_flags(model) for flag in pair)
            _ = 1 / 0
    assert _sync_flags(model) == before
    with strategy.no_backward_sync(model, enabled=False):  # a no-op
        assert _sync_flags(model) == before
    with pytest.raises(TypeError, match="no FSDP2 module"):
        strategy.no_backward_sync(nn.Linear(2, 2), enabled=True)
    with strategy.no_backward_sync(nn.Linear(2, 2), enabled=False):
        pass
    return {name: g for name, g in grads.items()}


@pytest.mark.parametrize(
    "world_size, plan, dp, tp", [case(2, "fsdp", 2, 1), case(4, "tp+fsdp", 2, 2)]
)
def test_no_backward_sync(world_size: int, plan: str, dp: int, tp: int) -> None:  # SYNC-1, MP-4
    results = run_on_ranks(rank_no_backward_sync, plan, dp, tp, world_size=world_size)
    for result in results[1:]:
        for name, grad in results[0].items():
            assert torch.equal(result[name], grad), name


# ---------------------------------------------------------------------- clipping
def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def rank_clip(ctx: Any, plan: str, dp: int, tp: int) -> dict[str, Any]:
    strategy = make_strategy(ctx, plan, dp=dp, tp=tp)
    model = strategy.setup_module(Net())
    optimizer = strategy.setup_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    reference = Net()
    dp_rank = strategy.distributed_sampler_kwargs["rank"]
    ids, target, my_ids, my_target = batch(0, dp_rank, dp)
    loss_fn(reference(ids), target).backward()
    strategy.backward(loss_fn(model(my_ids), my_target), model)

    inf_norm = strategy.clip_gradients_norm(model, optimizer, max_norm=1e9, norm_type=math.inf)
    expected_inf = torch.nn.utils.clip_grad_norm_(reference.parameters(), 1e9, math.inf)
    torch.testing.assert_close(inf_norm, expected_inf, rtol=1e-5, atol=0)
    norm = strategy.clip_gradients_norm(model, optimizer, max_norm=0.05)
    expected = torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.05)
    torch.testing.assert_close(norm, expected, rtol=1e-5, atol=0)
    grads = full_grads(model)
    for name, grad in full_grads(reference).items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-7, msg=name)

    first = next(p for p in model.parameters() if _local(p.grad).numel())
    if ctx.rank == 0:  # one rank's shard goes bad: every rank must raise
        with torch.no_grad():
            _local(first.grad).view(-1)[0] = float("nan")
    local_before = [_local(p.grad).clone() for p in model.parameters()]
    with pytest.raises(RuntimeError, match="not finite"):
        strategy.clip_gradients_norm(model, optimizer, max_norm=0.05)
    for p, before in zip(model.parameters(), local_before, strict=True):
        torch.testing.assert_close(_local(p.grad), before, rtol=0, atol=0, equal_nan=True)
    nan = strategy.clip_gradients_norm(model, optimizer, 0.05, error_if_nonfinite=False)
    assert torch.isnan(nan)
    with pytest.raises(TypeError, match="DTensor parameters"):
        strategy.clip_gradients_norm(nn.Linear(2, 2), optimizer, max_norm=1.0)
    return {"norm": norm, "inf": inf_norm}


@pytest.mark.parametrize(
    "world_size, plan, dp, tp",
    [case(2, "fsdp", 2, 1), case(4, "tp+fsdp", 2, 2), case(2, "tp", 1, 2)],
)
def test_clip_gradients_norm(world_size: int, plan: str, dp: int, tp: int) -> None:  # CLIP-1
    results = run_on_ranks(rank_clip, plan, dp, tp, world_size=world_size)
    for result in results:  # the same norm on every rank
        assert torch.equal(result["norm"], results[0]["norm"])
        assert torch.equal(result["inf"], results[0]["inf"])


# ---------------------------------------------------------------------- meta-device init
def _resets(module: nn.Module) -> dict[str, int]:
    return {name: mod.resets for name, mod in module.named_modules() if hasattr(mod, "resets")}


def rank_meta_init(ctx: Any, plan: str, dp: int, tp: int, tied: bool) -> dict[str, Any]:
    strategy = make_strategy(ctx, plan, dp=dp, tp=tp)
    with strategy.module_init_context(empty_init=False):
        eager = strategy.setup_module(Net(tied=tied))
    with strategy.module_init_context(empty_init=True):
        meta = Net(tied=tied)
    assert all(p.is_meta for p in meta.parameters())
    before = _resets(meta)
    meta = strategy.setup_module(meta)
    after = _resets(meta)
    assert {name: after[name] - before[name] for name in after} == dict.fromkeys(after, 1)
    assert not any(t.is_meta for t in (*meta.parameters(), *meta.buffers()))
    assert meta.offset.calls.item() == 0
    assert (meta.head.weight is meta.embed.weight) is tied
    eager_state = get_model_state_dict(eager, options=FULL)
    meta_state = get_model_state_dict(meta, options=FULL)
    assert list(meta_state) == list(eager_state)
    for name, value in eager_state.items():
        assert torch.equal(meta_state[name], value), name  # INIT-1: bitwise
    # the materialized model trains like the eager one
    optimizer = strategy.setup_optimizer(torch.optim.AdamW(meta.parameters(), lr=1e-2))
    *_, my_ids, my_target = batch(0, strategy.distributed_sampler_kwargs["rank"], dp)
    strategy.backward(loss_fn(meta(my_ids), my_target), meta)
    strategy.optimizer_step(optimizer)
    return {name: t for name, t in get_model_state_dict(meta, options=FULL).items()}


@pytest.mark.parametrize(
    "world_size, plan, dp, tp, tied",
    [case(1, "fsdp", 1, 1, True), case(2, "fsdp", 2, 1, True), case(4, "tp+fsdp", 2, 2, False)],
)
def test_meta_init_matches_eager_init(
    world_size: int, plan: str, dp: int, tp: int, tied: bool
) -> None:  # API-3, INIT-1
    results = run_on_ranks(rank_meta_init, plan, dp, tp, tied, world_size=world_size)
    for result in results[1:]:  # SHARD-2: gathered parameters equal on every rank
        for name, value in results[0].items():
            assert torch.equal(result[name], value), name
