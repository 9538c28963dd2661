"""Rank side of the API-surface tests (CONTRACT.md API-1..API-8): one probe per clause.

:func:`surface_rank` runs every probe of one family in ONE job. Each probe builds its own
strategy through ``ctx.make_strategy`` (the plug-in contract), drives one part of the
surface and records what it saw; an error or an ``Unsupported`` is recorded too, so that a
broken method fails only the test of its clause (``suites/test_api.py``, which also picks the
world size of each family's job).
"""

from __future__ import annotations

import gc
import traceback
import weakref
from collections.abc import Callable
from typing import Any, cast

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from harness import MeshStrategy, RankContext, Strategy, Unsupported
from harness.verdicts.attribution import clause_of
from suites.lib.ranks.readers import gathered_grads, gathered_state
from suites.lib.ranks.training import RankResult, Trained, setup, train
from suites.lib.shared.arguments import arguments
from suites.lib.shared.models import (
    BlockSpec,
    ModelSpec,
    build_model,
    iter_param_owners,
    make_batch,
)
from suites.lib.shared.specs import (
    FSDP2Config,
    FSDPConfig,
    MPConfig,
    OptimSpec,
    Scenario,
    TrainPlan,
    WrapSpec,
)

__all__ = [
    "FAMILIES",
    "LOSS_DOWN",
    "MP_PRECISIONS",
    "PRECISIONS",
    "SPEC",
    "probe_arguments",
    "scenario_of",
    "surface_rank",
]

#: a trunk with a nested wrap unit, a Scale (buffers, a one-element parameter) and a head
SPEC = ModelSpec(
    hidden=4, blocks=(BlockSpec(ffn=4), BlockSpec(kind="NestedBlock", ffn=2, inner=1)), seed=11
)
UNITS = ("Block", "NestedBlock")
FAMILIES = ("fsdp", "model_parallel", "fsdp2")
PRECISIONS = ("32-true", "bf16-mixed", "16-mixed")
#: bf16-mixed adds nothing to API-4 that 16-mixed does not check, and costs ~1 s at world 4
MP_PRECISIONS = ("32-true", "16-mixed")
#: API-4 multiplies the loss by this (a power of two: exact) so that fp16 gradients times a
#: grad scaler's 2**16 stay finite; the learning rate is divided by it to give the same step
LOSS_DOWN = 2.0**-8
LR = 0.1


def scenario_of(family: str, world: int, precision: str = "32-true", lr: float = LR) -> Scenario:
    """fsdp: FULL_SHARD with Block/NestedBlock units; model_parallel: dp=2 x tp (mlp plan);
    fsdp2: fully_shard on Block/NestedBlock units and the root over the world.

    Args:
        family: ``fsdp``, ``model_parallel`` or ``fsdp2``.
        world: the job's world size (the controller's choice; a rank passes its own).
        precision: the precision string.
        lr: the learning rate.
    """
    config: FSDPConfig | MPConfig | FSDP2Config
    if family == "fsdp":
        config = FSDPConfig(wrap=WrapSpec("classes", UNITS), precision=precision)
    elif family == "fsdp2":
        config = FSDP2Config(wrap=WrapSpec("classes", UNITS), precision=precision)
    else:
        dp = min(2, world)  # a 1x1 mesh at world size 1
        tp = world // dp
        plan = "mlp" if tp > 1 else "none"
        config = MPConfig(dp, tp, tp_plan=plan, fsdp_classes=UNITS, precision=precision)
    optim = OptimSpec("sgd", lr=lr, momentum=0.0)
    return Scenario(world, SPEC, config, optim, TrainPlan(steps=1, batch_size=2, data_seed=1))


def probe_arguments(probe: str, world: int) -> dict[str, tuple[str, ...]]:
    """The argument values the probe ``probe`` passes at world size ``world`` (for the
    coverage table: the probes run in one job that several checks share)."""
    if probe == "api3":  # module_init_context
        return arguments(empty_init=(False, None, True))
    if probe == "api5":  # all_reduce, broadcast from rank 0 and the last rank
        return arguments(reduce_op=("sum", "mean"), src=tuple(sorted({0, world - 1})))
    return {}


def _ready(ctx: RankContext, scenario: Scenario) -> Strategy:
    strategy = ctx.make_strategy(scenario.family, **scenario.options())
    strategy.setup_environment()
    return strategy


def _local_numel(param: Tensor) -> int:
    from torch.distributed.tensor import DTensor

    return param.to_local().numel() if isinstance(param, DTensor) else param.numel()


def _tensors(model: nn.Module) -> list[tuple[str, Tensor]]:
    return [*model.named_parameters(), *model.named_buffers()]


def _api1(ctx: Any, scenario: Scenario) -> dict[str, Any]:
    default = dist.group.WORLD
    _ready(ctx, scenario)
    value = torch.tensor([ctx.rank + 1.0], device=ctx.device)  # NCCL reduces CUDA tensors
    dist.all_reduce(value)
    return {
        "initialized": dist.is_initialized(),
        "same_group": dist.group.WORLD is default,
        "world_size": dist.get_world_size(),
        "sum": value.item(),
    }


def _api2(ctx: Any, scenario: Scenario) -> dict[str, Any]:
    strategy = _ready(ctx, scenario)
    with strategy.module_init_context(empty_init=False):
        model = build_model(SPEC)
    full = sum(p.numel() for p in model.parameters())
    module = strategy.setup_module(model)
    dp_rank = strategy.distributed_sampler_kwargs["rank"]
    x, _ = make_batch(SPEC, 0, 0, 0, dp_rank, 2)
    with torch.no_grad(), strategy.precision.forward_context():
        output = module(strategy.precision.convert_input(x.to(strategy.root_device)))
    foreign = torch.optim.SGD(build_model(SPEC).parameters(), lr=LR)
    with pytest.raises(ValueError, match=r"(?is)^(?=.*setup_module)(?=.*creat)") as refusal:
        strategy.setup_optimizer(foreign)
    optimizer = strategy.setup_optimizer(scenario.optim.build(module.named_parameters()))
    result = RankResult(ctx.rank, dp_rank)
    train(Trained(strategy, module, optimizer), scenario, result)
    result.state = gathered_state(module)
    result.extra = {
        "is_module": isinstance(module, nn.Module),
        "is_optimizer": isinstance(optimizer, torch.optim.Optimizer),
        "local": sum(_local_numel(p) for p in module.parameters()),
        "full": full,
        "input": x,
        "output": output.detach().float().cpu(),
        "refusal": str(refusal.value),
    }
    return {"result": result}


def _api2_joint(ctx: Any, scenario: Scenario) -> dict[str, Any]:
    strategy = _ready(ctx, scenario)
    with strategy.module_init_context(empty_init=False):
        model = build_model(SPEC)
    optimizer = scenario.optim.build(model.named_parameters())
    returned = strategy.setup_module_and_optimizers(model, [optimizer])
    shape = (
        type(returned).__name__,
        len(returned),
        type(returned[1]).__name__,
        len(returned[1]),
    )
    module, (optimizer,) = returned
    result = RankResult(ctx.rank, strategy.distributed_sampler_kwargs["rank"])
    train(Trained(strategy, module, optimizer), scenario, result)
    result.state = gathered_state(module)
    result.extra = {"shape": shape, "is_module": isinstance(module, nn.Module)}
    return {"result": result}


def _count_resets(model: nn.Module) -> dict[str, int]:
    """Count the ``reset_parameters()`` calls of every module that owns state directly."""
    calls: dict[str, int] = {}
    for name, module in iter_param_owners(model):
        calls[name] = 0

        def counted(
            *args: Any, _reset: Callable = module.reset_parameters, _name: str = name, **kwargs: Any
        ) -> Any:
            calls[_name] += 1
            return _reset(*args, **kwargs)

        module.reset_parameters = counted  # type: ignore[method-assign]
    return calls


def _api3(ctx: Any, scenario: Scenario) -> dict[str, Any]:
    strategy = _ready(ctx, scenario)
    out: dict[str, Any] = {}
    for empty_init in (False, None):
        with strategy.module_init_context(empty_init=empty_init):
            eager = build_model(SPEC)
        out[f"meta[{empty_init}]"] = [n for n, t in _tensors(eager) if t.is_meta]
        out[f"state[{empty_init}]"] = {k: v.detach().cpu() for k, v in eager.state_dict().items()}
    context = strategy.module_init_context(empty_init=True)
    out["is_context_manager"] = hasattr(context, "__enter__") and hasattr(context, "__exit__")
    with context:
        model: nn.Module = build_model(SPEC)
    out["real_under_empty_init"] = [n for n, t in _tensors(model) if not t.is_meta]
    calls = _count_resets(model)
    model = strategy.setup_module(model)
    out["meta_after_setup"] = [n for n, t in _tensors(model) if t.is_meta]
    out["reset_calls"] = dict(calls)
    return out


def _api4(ctx: Any, scenario: Scenario) -> dict[str, Any]:
    t = setup(ctx, scenario)
    strategy = t.strategy
    dp_rank = strategy.distributed_sampler_kwargs["rank"]
    x, y = make_batch(SPEC, scenario.plan.data_seed, 0, 0, dp_rank, scenario.plan.batch_size)
    x = strategy.precision.convert_input(x.to(strategy.root_device))
    with strategy.precision.forward_context():
        output = t.model(x)
    loss = F.mse_loss(output.float(), y.to(strategy.root_device))
    strategy.backward(loss * LOSS_DOWN, t.model)
    grads = gathered_grads(t.model)
    strategy.optimizer_step(t.optimizer)
    return {"grads": grads, "state": gathered_state(t.model), "loss": float(loss)}


def _api5(ctx: Any, scenario: Scenario) -> dict[str, Any]:
    strategy = _ready(ctx, scenario)
    x = torch.tensor([ctx.rank + 1.0, 2.0 * (ctx.rank + 1)])
    obj = {"rank": ctx.rank, "list": [ctx.rank] * 3, "tensor": torch.full((2,), float(ctx.rank))}
    sources = sorted({0, ctx.world_size - 1})
    broadcast = {src: strategy.broadcast(obj, src=src) for src in sources}
    strategy.barrier()
    strategy.barrier("api5")
    return {
        "sum": strategy.all_reduce(x.clone(), reduce_op="sum").tolist(),
        "mean": strategy.all_reduce(x.clone(), reduce_op="mean").tolist(),
        "default": strategy.all_reduce(x.clone()).tolist(),
        "int_sum": strategy.all_reduce(torch.tensor([ctx.rank + 1]), reduce_op="sum").tolist(),
        "non_tensor": [strategy.all_reduce(7, reduce_op="sum"), strategy.all_reduce("x")],
        "broadcast": {
            src: {**value, "tensor": value["tensor"].tolist()} for src, value in broadcast.items()
        },
    }


def _api6(ctx: Any, scenario: Scenario) -> dict[str, Any]:
    strategy = _ready(ctx, scenario)
    if scenario.family == "model_parallel":
        dp_mesh = cast(MeshStrategy, strategy).device_mesh["data_parallel"]
        expected = {"num_replicas": dp_mesh.size(), "rank": dp_mesh.get_local_rank()}
    else:
        expected = {"num_replicas": ctx.world_size, "rank": ctx.rank}
    return {
        "root_device": str(strategy.root_device),
        "device": str(ctx.device),
        "kwargs": dict(strategy.distributed_sampler_kwargs),
        "expected": expected,
    }


def _api7(ctx: Any, scenario: Scenario) -> str:
    strategy = _ready(ctx, scenario)
    with pytest.raises(NotImplementedError):
        _ = strategy.checkpoint_io
    with pytest.raises(NotImplementedError):
        strategy.checkpoint_io = object()
    return "refused"


def _api8(ctx: Any, scenario: Scenario) -> dict[str, Any]:
    default = dist.group.WORLD
    # [Note: frozen gc] a full gc.collect() walks torch's ~300k objects (~1 s per rank here);
    # freezing them first makes it walk only what this probe created, the module included
    gc.freeze()
    try:
        t = setup(ctx, scenario)
        train(t, scenario, RankResult(ctx.rank, t.strategy.distributed_sampler_kwargs["rank"]))
        strategy, module = t.strategy, weakref.ref(t.model)
        del t
        strategy.teardown()
        value = torch.tensor([ctx.rank + 1.0], device=ctx.device)
        dist.all_reduce(value)
        dist.barrier()
        gc.collect()
    finally:
        gc.unfreeze()
    return {
        "initialized": dist.is_initialized(),
        "same_group": dist.group.WORLD is default,
        "sum": value.item(),
        "module_released": module() is None,
    }


def _probe(out: dict[str, Any], name: str, fn: Callable[..., Any], *args: Any) -> None:
    """Run one probe; record ``("ok", value)``, ``("unsupported", exc)`` or
    ``("raised", (traceback, clause))``."""
    try:
        out[name] = ("ok", fn(*args))
    except Unsupported as exc:
        out[name] = ("unsupported", exc)
    except (Exception, pytest.fail.Exception) as exc:
        # the traceback, and the clause a strategy call attributed it to (harness.clause)
        out[name] = ("raised", ("".join(traceback.format_exception(exc)), clause_of(exc)))


def surface_rank(ctx: Any, family: str) -> dict[str, Any]:
    """Rank function: every probe of ``family``, by name (``api4[<precision>]`` per precision).

    Args:
        ctx: the harness ``RankContext``.
        family: ``fsdp`` or ``model_parallel``.
    """
    scenario = scenario_of(family, ctx.world_size)
    out: dict[str, Any] = {}
    for name, fn in (
        ("api1", _api1),
        ("api6", _api6),
        ("api7", _api7),
        ("api5", _api5),
        ("api2", _api2),
        ("api3", _api3),
    ):
        _probe(out, name, fn, ctx, scenario)
    if family == "fsdp":
        _probe(out, "api2_joint", _api2_joint, ctx, scenario)
    for precision in PRECISIONS if family == "fsdp" else MP_PRECISIONS:
        _probe(
            out,
            f"api4[{precision}]",
            _api4,
            ctx,
            scenario_of(family, ctx.world_size, precision, LR / LOSS_DOWN),
        )
    _probe(out, "api8", _api8, ctx, scenario)
    return out
