"""Rank side of the training checks (``test_training.py``): frozen and tied parameters
(TRAIN-2), ``no_backward_sync`` (SYNC-1), refusing a module that is no sharded root (SYNC-1,
CLIP-1), a non-finite norm (CLIP-1) and meta-device init (INIT-1). The plain training job,
:func:`suites.lib.ranks.training.train_rank`, serves the parity checks.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from harness import RankContext
from suites.lib.ranks.readers import gathered_state, local_grads, scaling
from suites.lib.ranks.structure import sync_flags, sync_flags_after_a_raise
from suites.lib.ranks.training import RankResult, end, micro_step, setup
from suites.lib.shared.arguments import arguments, passes
from suites.lib.shared.models import build_model, clean_name
from suites.lib.shared.parallelize import parallelize_zoo
from suites.lib.shared.specs import FSDP2Config, FSDPConfig, Scenario

__all__ = [
    "FINITE_MAX_NORM",
    "frozen_tied_rank",
    "init_rank",
    "no_sync_rank",
    "nonfinite_rank",
    "type_error_rank",
]

#: ``max_norm`` of :func:`nonfinite_rank`'s ordinary clip: small, so that the zoo's gradients
#: are scaled (gradients with a smaller norm are left as they are, which is right too)
FINITE_MAX_NORM = 1e-3


def frozen_tied_rank(ctx: Any, scenario: Scenario) -> RankResult:
    t = setup(ctx, scenario)
    result = RankResult(ctx.rank, t.strategy.distributed_sampler_kwargs["rank"])
    frozen = set(scenario.model.frozen)
    for step in range(scenario.plan.steps):
        result.losses.append([micro_step(t, scenario, step, 0, result.dp_rank)])
        graded = [
            clean_name(n)
            for n, p in t.model.named_parameters()
            if clean_name(n) in frozen and p.grad is not None
        ]
        result.extra.setdefault("frozen_with_grad", []).extend(graded)
        t.strategy.optimizer_step(t.optimizer)
        t.optimizer.zero_grad()
    by_id: dict[int, list[str]] = {}
    for name, param in t.model.named_parameters(remove_duplicate=False):
        by_id.setdefault(id(param), []).append(clean_name(name))
    result.extra["shared"] = sorted(sorted(names) for names in by_id.values() if len(names) > 1)
    result.state = gathered_state(t.model)
    end(t.strategy)
    return result


@passes(lambda scenario: arguments(enabled=(False, True), empty_init=scenario.empty_init))
def no_sync_rank(ctx: Any, scenario: Scenario) -> dict[str, Any]:
    t = setup(ctx, scenario)
    out: dict[str, Any] = {"before": sync_flags(t.model)}
    with t.strategy.no_backward_sync(t.model, enabled=False):
        out["disabled"] = sync_flags(t.model)
    out["after_raise"] = sync_flags_after_a_raise(t.strategy, t.model)
    assert out["after_raise"] == out["before"], (  # fail here: training on would only crash
        f"rank {ctx.rank}: after a body that raised, gradient sync is {out['after_raise']}; "
        f"before entering no_backward_sync it was {out['before']}"
    )
    result = RankResult(ctx.rank, t.strategy.distributed_sampler_kwargs["rank"])
    with t.strategy.no_backward_sync(t.model, enabled=True):
        out["inside"] = sync_flags(t.model)
        loss0 = micro_step(t, scenario, 0, 0, result.dp_rank)
        out["local_grads"] = {
            clean_name(n): p.grad.detach().clone()
            for n, p in t.model.named_parameters()
            if p.grad is not None
        }
    out["after"] = sync_flags(t.model)
    assert out["after"] == out["before"], (
        f"rank {ctx.rank}: after no_backward_sync exited, gradient sync is {out['after']}; "
        f"before entering it was {out['before']}"
    )
    loss1 = micro_step(t, scenario, 0, 1, result.dp_rank)
    result.losses.append([loss0, loss1])
    t.strategy.optimizer_step(t.optimizer)
    result.state = gathered_state(t.model)
    out["result"] = result
    end(t.strategy)
    return out


@passes(
    lambda family, which: (
        arguments(enabled=(False, True))
        if which == "no_backward_sync"
        else arguments(enabled=False, norm_type=2.0, error_if_nonfinite=True)
    )
)
def type_error_rank(ctx: RankContext, family: str, which: str) -> str:
    options: dict[str, Any] = {}
    if family == "model_parallel":
        options["parallelize_fn"] = parallelize_zoo
    strategy = ctx.make_strategy(family, **options)
    strategy.setup_environment()
    plain = nn.Linear(2, 2)
    optimizer = torch.optim.SGD(plain.parameters(), lr=0.1)
    with strategy.no_backward_sync(plain, enabled=False):
        pass  # a no-op, whatever the module
    try:
        if which == "no_backward_sync":
            with strategy.no_backward_sync(plain, enabled=True):
                pass
        else:
            strategy.clip_gradients_norm(plain, optimizer, max_norm=1.0)
    except TypeError as exc:
        return f"TypeError: {exc}"
    finally:
        end(strategy)
    return "no error"


@passes(
    lambda scenario: arguments(
        norm_type=(0.0, scenario.plan.norm_type),
        error_if_nonfinite=(True, False),
        empty_init=scenario.empty_init,
    )
)
def nonfinite_rank(ctx: Any, scenario: Scenario) -> dict[str, Any]:
    """CLIP-1 at its edges, with the plan's ``norm_type``.

    First an ordinary clip of finite gradients to :data:`FINITE_MAX_NORM`: its returned norm
    and the factor it scaled this rank's gradients by are reported. Then ``norm_type=0`` (no
    norm) must be refused with the gradients unchanged; then, for each of ``inf`` and ``nan``
    in turn, the gradients of a fresh backward get one element set to it and are clipped to
    ``1e-3`` with ``error_if_nonfinite=True`` (must raise, gradients unchanged) and then
    ``False``: the returned norm and this rank's local gradients before and after are
    reported."""
    from torch.distributed.tensor import DTensor

    norm_type = scenario.plan.norm_type
    t = setup(ctx, scenario)
    dp_rank = t.strategy.distributed_sampler_kwargs["rank"]
    # replicated gradients are poisoned on every rank that holds a copy, as real replicas would
    # be: NO_SHARD and the replicas of HYBRID (every rank's first gradient) and, under
    # model_parallel, a gradient the tensor-parallel plan leaves replicated on each tp rank
    # of the chosen rank's column (see _copy). Sharded ones only on one rank that holds any
    # gradient, so that the other ranks must learn of it from the collective norm: inf on the
    # first such rank, nan on the last (a MAX reduction of gloo drops a nan that is not rank 0's)
    replicated = (
        isinstance(scenario.strategy, FSDPConfig)
        and (
            scenario.strategy.sharding_strategy == "NO_SHARD"
            or "HYBRID" in scenario.strategy.sharding_strategy
        )
    ) or (isinstance(scenario.strategy, FSDP2Config) and scenario.strategy.device_mesh is not None)
    copies = scenario.family == "model_parallel"
    out: dict[str, Any] = {}
    # the ordinary case first: a clip that scales finite gradients wrongly is that finding,
    # not the non-finite cases' different gradients after it
    t.optimizer.zero_grad(set_to_none=True)
    micro_step(t, scenario, 0, 0, dp_rank)
    before = [g.detach().clone() for g in local_grads(t.model)]
    norm = t.strategy.clip_gradients_norm(
        t.model, t.optimizer, max_norm=FINITE_MAX_NORM, norm_type=norm_type
    )
    out["finite"] = {"norm": float(norm), "scaled": scaling(before, local_grads(t.model))}
    for poison in ("inf", "nan"):
        t.optimizer.zero_grad(set_to_none=True)
        micro_step(t, scenario, 0, 0, dp_rank)
        grads = [p.grad for p in t.model.parameters() if p.grad is not None]
        local = [g.to_local() if isinstance(g, DTensor) else g for g in grads]
        if poison == "inf":  # norm_type=0 first, on finite gradients
            before = [g.clone() for g in local]
            try:
                t.strategy.clip_gradients_norm(t.model, t.optimizer, max_norm=1.0, norm_type=0.0)
                out["zero"] = "nothing"
            except ValueError as exc:
                out["zero"] = f"ValueError: {exc}"
            out["zero_unchanged"] = _same(before, local)
        poisoned = _poisoned(ctx, grads, local, poison, replicated, copies)
        if poisoned is not None:
            poisoned.view(-1)[0] = float(poison)
        seen: dict[str, Any] = {}
        before = [g.clone() for g in local]
        try:
            t.strategy.clip_gradients_norm(
                t.model, t.optimizer, max_norm=1e-3, norm_type=norm_type, error_if_nonfinite=True
            )
            seen["raised"] = "nothing"
        except RuntimeError as exc:
            seen["raised"] = f"RuntimeError: {exc}"
        seen["unchanged"] = _same(before, local)
        before = [g.clone() for g in local]
        norm = t.strategy.clip_gradients_norm(
            t.model, t.optimizer, max_norm=1e-3, norm_type=norm_type, error_if_nonfinite=False
        )
        seen["norm"] = float(norm)
        seen["before"] = [g.detach().to("cpu", copy=True) for g in before]
        seen["after"] = [g.detach().to("cpu", copy=True) for g in local]
        out[poison] = seen
    end(t.strategy)
    return out


def _poisoned(
    ctx: Any,
    grads: list[torch.Tensor],
    local: list[torch.Tensor],
    poison: str,
    replicated: bool,
    copies: bool,
) -> torch.Tensor | None:
    """The local gradient this rank sets one element of to ``poison``, or None.

    One rank is chosen among those that hold any gradient elements: the first for ``inf``, the
    last for ``nan``. With ``copies`` (model_parallel) it poisons its first non-empty gradient
    held by fewer than every rank (a sharded one, so that a strategy deciding from its own
    shards is caught), else its first, and so does every rank that holds a copy of that same
    gradient (:func:`_copy`). Otherwise, the chosen rank alone poisons its first non-empty
    gradient, or every rank its own where the family replicates them (``replicated``)."""
    held = [
        (index, _copy(grad, ctx.rank) if copies else ("rank", ctx.rank))
        for index, (grad, part) in enumerate(zip(grads, local, strict=True))
        if part.numel() > 0
    ]
    everyone: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(everyone, held)
    holding = [rank for rank, theirs in enumerate(everyone) if theirs]
    chosen = holding[0] if poison == "inf" else holding[-1]
    if not held:
        return None
    if replicated and not copies:
        return local[held[0][0]]
    if not copies:
        return local[held[0][0]] if ctx.rank == chosen else None
    theirs = everyone[chosen]
    counts = [sum(entry in ranks for ranks in everyone) for entry in theirs]
    target = next(
        (entry for entry, n in zip(theirs, counts, strict=True) if n < ctx.world_size), theirs[0]
    )
    return local[target[0]] if target in held else None


def _copy(grad: torch.Tensor, rank: int) -> tuple[Any, ...]:
    """Which copy of ``grad`` this rank holds, under model_parallel: ranks with equal values
    hold identical copies of the same gradient (real training keeps them equal).

    A plain tensor (no DTensor: replicated on every rank) is ``()``. A DTensor's copy is named
    by this rank's coordinates on the mesh dims it is sharded over, the tensor-parallel dim
    being left out where it is ``Replicate()`` there; a DTensor on the data-parallel submesh
    alone (a parameter the tensor-parallel plan leaves out) is thereby the same copy on each
    tp rank of a column. A DTensor on an unnamed mesh is this rank's alone."""
    from torch.distributed.tensor import DTensor

    from suites.lib.shared.parallelize import TP_DIM

    if not isinstance(grad, DTensor):
        return ()
    mesh = grad.device_mesh
    names = mesh.mesh_dim_names
    coordinate = mesh.get_coordinate()
    if names is None or coordinate is None:
        return ("rank", rank)
    return tuple(
        (name, at)
        for name, at, placement in zip(names, coordinate, grad.placements, strict=True)
        if not (name == TP_DIM and placement.is_replicate())
    )


def _same(before: list[torch.Tensor], after: list[torch.Tensor]) -> bool:
    """Whether the gradients are unchanged, a nan being the same as a nan."""
    return all(
        torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())
        for a, b in zip(before, after, strict=True)
    )


@passes(lambda scenario: arguments(empty_init=scenario.empty_init))
def init_rank(ctx: Any, scenario: Scenario) -> dict[str, Any]:
    t = setup(ctx, scenario)
    plain = build_model(scenario.model, "meta")
    volatile = set(dict(plain.named_buffers())) - set(plain.state_dict())
    buffers = {
        clean_name(n): b.detach().to("cpu", copy=True)
        for n, b in t.model.named_buffers()
        if clean_name(n) in volatile
    }
    shared = []
    if scenario.model.tied:
        ids: dict[int, list[str]] = {}
        for name, param in t.model.named_parameters(remove_duplicate=False):
            ids.setdefault(id(param), []).append(clean_name(name))
        shared = sorted(sorted(v) for v in ids.values() if len(v) > 1)
    out = {"state": gathered_state(t.model), "non_persistent": buffers, "shared": shared}
    end(t.strategy)
    return out
