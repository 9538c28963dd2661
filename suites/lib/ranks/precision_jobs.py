"""Rank side of the precision checks (``test_precision.py``, ``test_precision_model_parallel.py``,
and the grad scaler's skip in ``test_cuda.py``): the dtypes a step leaves, the sharded grad
scaler's skipped step, the buffers' compute and saved dtypes.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.nn.functional as F

from harness import RankContext
from suites.lib.ranks.checkpoint_jobs import format_options
from suites.lib.ranks.cuda_jobs import expected_index
from suites.lib.ranks.fsdp2_readers import reduce_dtypes, unit_dtypes
from suites.lib.ranks.readers import gathered_state, local
from suites.lib.ranks.training import (
    Trained,
    compute_dtypes,
    end,
    micro_step,
    optimizer_state_dtypes,
    setup,
)
from suites.lib.shared.models import Scale, build_model, clean_name, make_batch
from suites.lib.shared.specs import Scenario

__all__ = [
    "buffer_rank",
    "dtype_rank",
    "frozen_start_rank",
    "skip_rank",
    "true_low_dtype_rank",
]


def dtype_rank(ctx: Any, scenario: Scenario) -> dict[str, Any]:
    t = setup(ctx, scenario)
    out: dict[str, Any] = {"compute": compute_dtypes(t, scenario)}
    out["grads"] = sorted({str(p.grad.dtype) for p in t.model.parameters() if p.grad is not None})
    t.strategy.optimizer_step(t.optimizer)
    out["params"] = sorted({str(p.dtype) for p in t.model.parameters()})
    out["optim"] = optimizer_state_dtypes(t.optimizer)
    reduce = set()
    for module in t.model.modules():
        policy = getattr(module, "mixed_precision", None)  # FSDP1 units
        if policy is not None and hasattr(policy, "reduce_dtype"):
            reduce.add(str(policy.reduce_dtype))
    reduce.update(reduce_dtypes(t.model))  # FSDP2 units (fsdp2 and model_parallel)
    out["reduce"] = sorted(reduce)
    end(t.strategy)
    return out


def frozen_start_rank(ctx: Any, scenario: Scenario, unit: str) -> dict[str, Any]:
    """Freeze every parameter of ``unit`` before the first forward, take a step, unfreeze
    it and run a forward and a backward (PREC-2 on a unit frozen at the first forward).

    Returns what that backward raised (``raised``, else None), the unit's FSDP2 groups'
    ``(reduce, cast-back)`` dtypes after it (``unit``), and the dtypes of its parameters and
    their gradients (``params``, ``grads``)."""
    t = setup(ctx, scenario)
    dp_rank = t.strategy.distributed_sampler_kwargs["rank"]
    params = [p for n, p in t.model.named_parameters() if clean_name(n).startswith(f"{unit}.")]
    for param in params:
        param.requires_grad_(False)
    micro_step(t, scenario, 0, 0, dp_rank)
    t.strategy.optimizer_step(t.optimizer)
    t.optimizer.zero_grad()
    for param in params:
        param.requires_grad_(True)
    x, y = make_batch(scenario.model, scenario.plan.data_seed, 1, 0, dp_rank, 2)
    x = t.strategy.precision.convert_input(x.to(t.strategy.root_device))
    with t.strategy.precision.forward_context():
        out = t.model(x)
    loss = F.mse_loss(out.float(), y.to(t.strategy.root_device))
    raised = None
    try:  # every rank raises at the same point (the reduced gradient's assignment)
        t.strategy.backward(loss, t.model)
    except RuntimeError as exc:
        raised = f"{type(exc).__name__}: {exc}"
    read = {
        "raised": raised,
        "unit": unit_dtypes(t.model, unit),
        "params": sorted({str(p.dtype) for p in params}),
        "grads": sorted({str(p.grad.dtype) for p in params if p.grad is not None}),
    }
    end(t.strategy)
    return read


def skip_rank(ctx: Any, scenario: Scenario) -> dict[str, Any]:
    """One step with an inf in rank 0's gradient shard, then a finite one."""
    t = setup(ctx, scenario)
    dp_rank = t.strategy.distributed_sampler_kwargs["rank"]
    initial = gathered_state(t.model)
    micro_step(t, scenario, 0, 0, dp_rank)
    grads = [local(p.grad) for p in t.model.parameters() if p.grad is not None]
    devices = sorted({str(g.device) for g in grads})
    if ctx.rank == 0:  # one rank sees an overflow in its own gradient shard
        grad = next(g for g in grads if g.numel() > 0)
        grad.view(-1)[0] = float("inf")
    t.strategy.optimizer_step(t.optimizer)
    t.optimizer.zero_grad()
    skipped = gathered_state(t.model)
    micro_step(t, scenario, 1, 0, dp_rank)
    t.strategy.optimizer_step(t.optimizer)
    out = {
        "initial": initial,
        "skipped": skipped,
        "stepped": gathered_state(t.model),
        "grad_devices": devices,
        "cuda": f"cuda:{expected_index(ctx)}",
    }
    end(t.strategy)
    return out


def buffer_rank(ctx: Any, scenario: Scenario) -> dict[str, Any]:
    """One training forward and backward; the buffers as the forward saw them, as the
    gathered state dict holds them, and as a full checkpoint writes them to the file (read
    back with ``torch.load``, not through a load that would cast them to the module's dtype)."""
    t = setup(ctx, scenario, **format_options(scenario.family, "full"))
    micro_step(t, scenario, 0, 0, t.strategy.distributed_sampler_kwargs["rank"])
    seen = {clean_name(n): m.seen_dtype for n, m in t.model.named_modules() if isinstance(m, Scale)}
    state = gathered_state(t.model)
    path = os.path.join(ctx.tmp_dir, "buffers.pt")
    t.strategy.save_checkpoint(path, {"model": t.model})
    written = torch.load(path, weights_only=True)["model"]
    end(t.strategy)
    buffer = state.get("scale.scale")
    return {
        "seen": seen.get("scale"),
        "saved": None if buffer is None else (str(buffer.dtype), tuple(buffer.shape)),
        "value": buffer,
        "offset_saved": "scale.offset" in state,
        "layout": {k: (str(v.dtype), tuple(v.shape)) for k, v in state.items()},
        "written": {k: (str(v.dtype), tuple(v.shape)) for k, v in written.items()},
        "counters": {k: v for k, v in state.items() if not v.is_floating_point()},
    }


def true_low_dtype_rank(ctx: RankContext, scenario: Scenario) -> dict[str, Any]:
    """One step; the dtypes of parameters at creation, after set-up, in compute, of the
    gradients and of the optimizer state."""
    strategy = ctx.make_strategy(scenario.family, **scenario.options())
    strategy.setup_environment()
    with strategy.module_init_context(empty_init=scenario.empty_init):
        model: torch.nn.Module = build_model(scenario.model)
    out: dict[str, Any] = {"created": sorted({str(p.dtype) for p in model.parameters()})}
    model = strategy.setup_module(model)
    optimizer = strategy.setup_optimizer(scenario.optim.build(model.named_parameters()))
    t = Trained(strategy, model, optimizer)
    out["setup"] = sorted({str(p.dtype) for p in t.model.parameters()})
    out["compute"] = compute_dtypes(t, scenario)
    out["grads"] = sorted({str(p.grad.dtype) for p in t.model.parameters() if p.grad is not None})
    t.strategy.optimizer_step(t.optimizer)
    out["optim"] = optimizer_state_dtypes(t.optimizer)
    out["stepped"] = sorted({str(p.dtype) for p in t.model.parameters()})
    end(t.strategy)
    return out
