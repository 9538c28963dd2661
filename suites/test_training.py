"""CONTRACT.md TRAIN-1, TRAIN-2, TRAIN-3, SYNC-1, CLIP-1 and INIT-1 (training semantics):
parity, frozen/tied, uneven sizes, accumulation with ``no_backward_sync``, gradient
clipping, meta-device init.

The reference is the plain model trained in the controller
(``suites/lib/controller/oracles.py``); the strategy is reached only through
``ctx.make_strategy`` (``--strategy``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from hypothesis import example, given
from hypothesis import strategies as st
from torch import nn

from harness import RankContext
from suites.lib.controller.clause_covers import covering_examples
from suites.lib.controller.dispatch import run
from suites.lib.controller.oracles import (
    assert_close,
    assert_close_state,
    assert_parity,
    reference_model,
    reference_run,
)
from suites.lib.controller.regressions import (
    CLIP_FSDP2,
    CLIP_NO_SHARD,
    INIT_FSDP2,
    INIT_NESTED,
    INIT_ZOO,
    SYNC_NESTED,
    SYNC_TIED_MIXED,
    TRAIN_ZOO,
)
from suites.lib.controller.scenarios import SHARDING_STRATEGIES, job_world, scenarios, train_plans
from suites.lib.controller.tolerances import EXACT, tolerance
from suites.lib.ranks.readers import gathered_state
from suites.lib.ranks.structure import sync_flags
from suites.lib.ranks.training import RankResult, end, micro_step, setup, train_rank
from suites.lib.shared.models import build_model, clean_name, make_batch
from suites.lib.shared.parallelize import parallelize_zoo
from suites.lib.shared.specs import FSDPConfig, Scenario, TrainPlan

FAMILIES = st.sampled_from(["fsdp", "model_parallel"])
SHARDED = ("FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "_HYBRID_SHARD_ZERO2")


@pytest.mark.clause("TRAIN-1")
@given(scenarios("fsdp", plan=train_plans(max_steps=2)))
@example(TRAIN_ZOO)
def test_training_matches_the_unsharded_model(scenario: Scenario) -> None:
    results = run(train_rank, scenario, world_size=scenario.world_size)
    assert_parity(results, scenario)


def _frozen_tied_rank(ctx: Any, scenario: Scenario) -> RankResult:
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


@pytest.mark.clause("TRAIN-2")
@covering_examples("TRAIN-2", keep=lambda s: s.model.tied or bool(s.model.frozen))
@given(
    FAMILIES.flatmap(
        lambda family: scenarios(
            family, tied=True, frozen=True, sharding=SHARDING_STRATEGIES, plan=train_plans()
        )
    )
)
def test_frozen_parameters_stay_and_tied_parameters_stay_tied(scenario: Scenario) -> None:
    results = run(_frozen_tied_rank, scenario, world_size=scenario.world_size)
    initial = reference_run(scenario, steps=0).initial
    for r in results:
        assert not r.extra.get("frozen_with_grad"), (
            f"rank {r.rank}: frozen parameters got a gradient: {r.extra['frozen_with_grad']}"
        )
        frozen = {k: initial[k] for k in scenario.model.frozen}
        assert_close_state(r.state, frozen, EXACT, what=f"rank {r.rank}: frozen parameter")
        if not scenario.model.tied:  # a covering example may have frozen parameters only
            continue
        assert ["embed.weight", "head.weight"] in r.extra["shared"], (
            f"rank {r.rank}: embed.weight and head.weight are no longer one tensor "
            f"(shared parameters: {r.extra['shared']})"
        )
        assert_close(
            r.state["head.weight"], r.state["embed.weight"], EXACT, name="tied head.weight"
        )
    assert_parity(results, scenario)  # updated once, like the plain model's single tensor


def _uneven(scenario: Scenario) -> bool:
    """``scale.gate`` (one element) is split over two ranks or more: some shard is empty."""
    return scenario.model.scale and scenario.shard_factor >= 2


@pytest.mark.clause("TRAIN-3")
@covering_examples("TRAIN-3", keep=_uneven)
@given(
    scenarios(
        "fsdp",
        min_world=3,
        scale=True,
        sharding=SHARDED,
        wrap_kinds=("classes", "none"),
        plan=train_plans(),
    )
)
def test_uneven_sizes_train_like_even_ones(scenario: Scenario) -> None:
    # scale.gate has one element: at world >= 3 most ranks hold an empty shard of it
    results = run(train_rank, scenario, world_size=scenario.world_size)
    assert_parity(results, scenario)


def _no_sync_rank(ctx: Any, scenario: Scenario) -> dict[str, Any]:
    t = setup(ctx, scenario)
    out: dict[str, Any] = {"before": sync_flags(t.model)}
    with t.strategy.no_backward_sync(t.model, enabled=False):
        out["disabled"] = sync_flags(t.model)
    try:
        with t.strategy.no_backward_sync(t.model, enabled=True):
            raise KeyError("the body raised")
    except KeyError:
        pass
    out["after_raise"] = sync_flags(t.model)
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


def _local_grads(scenario: Scenario, dp_rank: int) -> dict[str, torch.Tensor]:
    model = reference_model(scenario)
    plan = scenario.plan
    x, y = make_batch(scenario.model, plan.data_seed, 0, 0, dp_rank, plan.batch_size)
    (F.mse_loss(model(x), y) * plan.loss_scale / plan.micro_batches).backward()
    return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.clause("SYNC-1")
@given(scenarios("fsdp", plan=st.builds(TrainPlan, steps=st.just(1), micro_batches=st.just(2))))
@example(SYNC_NESTED)
def test_no_backward_sync_skips_reduction_and_restores_it(scenario: Scenario) -> None:
    outs = run(_no_sync_rank, scenario, world_size=scenario.world_size)
    tol = tolerance(scenario.precision, scenario.optim.kind)
    for rank, out in enumerate(outs):
        before = out["before"]
        assert all(v is True for v in before.values()), f"rank {rank}: sync off at start {before}"
        assert out["disabled"] == before, f"rank {rank}: enabled=False changed sync: {out}"
        assert out["after_raise"] == before, (
            f"rank {rank}: after the body raised, sync is {out['after_raise']}, was {before}"
        )
        assert not any(out["inside"].values()), f"rank {rank}: sync on inside: {out['inside']}"
        assert out["after"] == before, f"rank {rank}: sync not restored: {out['after']}"
        # inside, each rank's gradient is its own micro-batch's: not reduced across ranks
        local = _local_grads(scenario, out["result"].dp_rank)
        got = {
            k: v for k, v in out["local_grads"].items() if k in local and v.shape == local[k].shape
        }
        assert got, f"rank {rank}: no full-shaped local gradient inside no_backward_sync"
        assert_close_state(got, local, tol, what=f"rank {rank}: unreduced gradient", keys=set(got))
    assert_parity([out["result"] for out in outs], scenario)


@pytest.mark.clause("SYNC-1")
@given(scenarios("fsdp", plan=train_plans(min_micro=2, max_micro=3)))
@example(SYNC_TIED_MIXED)
def test_accumulating_micro_batches_equals_one_big_batch(scenario: Scenario) -> None:
    results = run(train_rank, scenario, world_size=scenario.world_size)
    assert_parity(results, scenario)


def _type_error_rank(ctx: RankContext, family: str, which: str) -> str:
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


@pytest.mark.clause("SYNC-1", "CLIP-1")
@pytest.mark.parametrize("which", ["no_backward_sync", "clip_gradients_norm"])
@pytest.mark.parametrize("family", ["fsdp", "model_parallel"])
def test_a_module_that_is_not_a_sharded_root_is_refused(family: str, which: str) -> None:
    clause_id = "SYNC-1" if which == "no_backward_sync" else "CLIP-1"
    for rank, outcome in enumerate(run(_type_error_rank, family, which, world_size=job_world())):
        assert outcome.startswith("TypeError"), (
            f"rank {rank}: {clause_id}: {which} on a plain nn.Linear gave {outcome!r}, "
            "expected TypeError"
        )


@pytest.mark.clause("CLIP-1")
@given(
    FAMILIES.flatmap(
        lambda family: scenarios(
            family,
            sharding=SHARDING_STRATEGIES,
            precisions=("32-true", "16-mixed") if family == "fsdp" else ("32-true",),
            plan=train_plans(clip=True),
        )
    )
)
@example(CLIP_NO_SHARD)
@example(CLIP_FSDP2)
def test_clipping_uses_the_global_norm(scenario: Scenario) -> None:
    results = run(train_rank, scenario, True, world_size=scenario.world_size)
    for r in results:
        assert r.norms == results[0].norms, (
            f"rank {r.rank} returned norms {r.norms}, rank 0 {results[0].norms}"
        )
    assert_parity(results, scenario, norms=True, grads=True)


def _nonfinite_rank(ctx: Any, scenario: Scenario) -> dict[str, Any]:
    from torch.distributed.tensor import DTensor

    t = setup(ctx, scenario)
    micro_step(t, scenario, 0, 0, t.strategy.distributed_sampler_kwargs["rank"])
    grads = [p.grad for p in t.model.parameters() if p.grad is not None]
    local = [g.to_local() if isinstance(g, DTensor) else g for g in grads]
    poisoned = next((g for g in local if g.numel() > 0), None)
    # replicated gradients (NO_SHARD, the replicas of HYBRID) are poisoned on every rank, as
    # real replicas would be; sharded ones only on the first rank that holds any gradient,
    # so that the other ranks must learn of it from the collective norm
    replicated = isinstance(scenario.strategy, FSDPConfig) and (
        scenario.strategy.sharding_strategy == "NO_SHARD"
        or "HYBRID" in scenario.strategy.sharding_strategy
    )
    holders = [torch.zeros(1, dtype=torch.long, device=ctx.device) for _ in range(ctx.world_size)]
    dist.all_gather(holders, torch.tensor([int(poisoned is not None)], device=ctx.device))
    first = min(i for i, h in enumerate(holders) if int(h))
    if poisoned is not None and (replicated or ctx.rank == first):
        poisoned.view(-1)[0] = float("inf")
    before = [g.clone() for g in local]
    out: dict[str, Any] = {}
    try:
        t.strategy.clip_gradients_norm(t.model, t.optimizer, max_norm=1e-3)
        out["raised"] = "nothing"
    except RuntimeError as exc:
        out["raised"] = f"RuntimeError: {exc}"
    out["unchanged"] = all(torch.equal(a, b) for a, b in zip(before, local, strict=True))
    norm = t.strategy.clip_gradients_norm(
        t.model, t.optimizer, max_norm=1e-3, error_if_nonfinite=False
    )
    out["norm"] = float(norm)
    end(t.strategy)
    return out


@pytest.mark.clause("CLIP-1")
@given(FAMILIES.flatmap(lambda family: scenarios(family, sharding=SHARDING_STRATEGIES)))
def test_a_nonfinite_norm_raises_on_every_rank_and_leaves_gradients(scenario: Scenario) -> None:
    outs = run(_nonfinite_rank, scenario, world_size=scenario.world_size)
    for rank, out in enumerate(outs):
        assert out["raised"].startswith("RuntimeError"), (
            f"rank {rank}: a non-finite total norm with error_if_nonfinite=True gave "
            f"{out['raised']!r}, expected RuntimeError on every rank"
        )
        assert out["unchanged"], f"rank {rank}: gradients were scaled although the norm is inf"
        assert not torch.isfinite(torch.tensor(out["norm"])), (
            f"rank {rank}: error_if_nonfinite=False returned a finite norm {out['norm']}"
        )


def _init_rank(ctx: Any, scenario: Scenario) -> dict[str, Any]:
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


@pytest.mark.clause("INIT-1")
@covering_examples("INIT-1", adapt=lambda s: dataclasses.replace(s, empty_init=True))
@given(
    FAMILIES.flatmap(
        lambda family: scenarios(
            family,
            empty_init=True,
            nested=True,
            sharding=SHARDING_STRATEGIES,
            wrap_kinds=("classes", "size", "callable"),
        )
    )
)
@example(INIT_NESTED)
@example(INIT_FSDP2)
@example(INIT_ZOO)
def test_meta_device_init_equals_eager_init(scenario: Scenario) -> None:
    eager = reference_model(scenario)  # under *-true: eager values rounded to the low dtype
    expected = eager.state_dict()
    for rank, out in enumerate(run(_init_rank, scenario, world_size=scenario.world_size)):
        assert_close_state(out["state"], expected, EXACT, what=f"rank {rank}: parameter/buffer")
        for name, value in eager.named_buffers():  # Scale.offset, the rotary tables
            if name not in expected:
                assert_close(
                    out["non_persistent"].get(name, torch.empty(0)),
                    value,
                    EXACT,
                    name=f"rank {rank}: non-persistent buffer {name!r}",
                )
        if scenario.model.tied:
            assert ["embed.weight", "head.weight"] in out["shared"], (
                f"rank {rank}: after meta init, embed.weight and head.weight are not one tensor"
            )
