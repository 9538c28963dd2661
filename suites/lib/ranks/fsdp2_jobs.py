"""Rank side of the fsdp2 family's checks (``suites/test_fsdp2.py``, FSDP2-1 .. FSDP2-4):
the units of the set-up model, the parameters' layout after a forward, the dtypes the
mixed-precision policy gathers, reduces and outputs in."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from harness import RankContext
from suites.lib.ranks.fsdp2_readers import fsdp2_units, param_layouts, reduce_dtypes
from suites.lib.ranks.training import end, micro_step, setup
from suites.lib.shared.models import make_batch
from suites.lib.shared.specs import Scenario

__all__ = ["after_forward_rank", "policy_dtypes_rank", "reshard_size_rank", "units_rank"]


def units_rank(ctx: RankContext, scenario: Scenario) -> dict[str, Any]:
    """The FSDP2 units of the set-up model and each parameter's kind and placements."""
    from torch.distributed.tensor import DTensor

    t = setup(ctx, scenario)
    placements = {
        name: str(tuple(p.placements)) if isinstance(p, DTensor) else "plain tensor"
        for name, p in t.model.named_parameters()
    }
    out = {"units": fsdp2_units(t.model), "placements": placements}
    end(t.strategy)
    return out


def after_forward_rank(ctx: RankContext, scenario: Scenario) -> dict[str, Any]:
    """The parameters' layout right after one training forward (no backward yet)."""
    t = setup(ctx, scenario)
    plan = scenario.plan
    dp_rank = t.strategy.distributed_sampler_kwargs["rank"]
    x, _ = make_batch(scenario.model, plan.data_seed, 0, 0, dp_rank, plan.batch_size)
    x = t.strategy.precision.convert_input(x.to(t.strategy.root_device))
    with t.strategy.precision.forward_context():
        out = t.model(x)
    layouts = param_layouts(t.model)
    t.strategy.backward(out.float().sum() * 0, t.model)  # leave no unit waiting for backward
    end(t.strategy)
    return layouts


def reshard_size_rank(ctx: RankContext, scenario: Scenario) -> str:
    """What building a strategy whose int ``reshard_after_forward`` does not divide the
    shard dimension raises (at construction, environment or set-up)."""
    try:
        t = setup(ctx, scenario)
    except ValueError as exc:
        return f"ValueError: {exc}"
    end(t.strategy)
    return "no error"


def policy_dtypes_rank(ctx: RankContext, scenario: Scenario) -> dict[str, Any]:
    """The dtype of every Linear's weight as its forward sees it and the model's output,
    the dtypes FSDP2 reduces gradients in, and the stored dtypes after a step."""
    t = setup(ctx, scenario)
    seen: set[str] = set()
    output: list[str] = []

    def record(module: nn.Module, args: Any) -> None:
        seen.add(str(module.weight.dtype))

    hooks = [m.register_forward_pre_hook(record) for m in t.model.modules() if _is_linear(m)]
    hooks.append(t.model.register_forward_hook(lambda m, a, o: output.append(str(o.dtype))))
    micro_step(t, scenario, 0, 0, t.strategy.distributed_sampler_kwargs["rank"])
    for handle in hooks:
        handle.remove()
    out = {
        "forward": sorted(seen),
        "output": output[0],
        "reduce": reduce_dtypes(t.model),
        "grads": sorted({str(p.grad.dtype) for p in t.model.parameters() if p.grad is not None}),
    }
    t.strategy.optimizer_step(t.optimizer)
    out["params"] = sorted({str(p.dtype) for p in t.model.parameters()})
    end(t.strategy)
    return out


def _is_linear(module: nn.Module) -> bool:
    return isinstance(module, torch.nn.Linear)
