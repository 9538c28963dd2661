"""CONTRACT.md TRAIN-1, TRAIN-2, TRAIN-3, SYNC-1, CLIP-1 and INIT-1 (training semantics):
parity, frozen/tied, uneven sizes, accumulation with ``no_backward_sync``, gradient
clipping, meta-device init.

The reference is the plain model trained in the controller
(``suites/lib/controller/oracles.py``); the strategy is reached only through
``ctx.make_strategy`` (``--strategy``).
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import example, given
from hypothesis import strategies as st

from suites.lib.controller.clause_covers import covering_examples
from suites.lib.controller.dispatch import run
from suites.lib.controller.oracles import (
    assert_clip_scales,
    assert_clipped,
    assert_close,
    assert_close_state,
    assert_parity,
    reference_model,
    reference_run,
    scenario_tolerance,
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
from suites.lib.ranks.training import train_rank
from suites.lib.ranks.training_jobs import (
    FINITE_MAX_NORM,
    frozen_tied_rank,
    init_rank,
    no_sync_rank,
    nonfinite_rank,
    type_error_rank,
)
from suites.lib.shared.arguments import DECLARED
from suites.lib.shared.models import make_batch
from suites.lib.shared.specs import Scenario, TrainPlan

FAMILIES = st.sampled_from(["fsdp", "model_parallel", "fsdp2"])
#: the families that shard by their own wrap policy
SELF_SHARDING = st.sampled_from(["fsdp", "fsdp2"])
SHARDED = ("FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "_HYBRID_SHARD_ZERO2")
#: the norm types CLIP-1 speaks of (harness.clauses.ARGUMENTS), as clip_gradients_norm takes them
NORM_TYPES = tuple(float(value) for value in DECLARED["norm_type"])
#: the max_norm the non-finite check clips to
NONFINITE_MAX_NORM = 1e-3


def _clip_arguments(plans: st.SearchStrategy[TrainPlan]) -> st.SearchStrategy[TrainPlan]:
    """``plans`` passing a declared ``norm_type`` and either ``error_if_nonfinite``."""
    return st.builds(
        lambda plan, norm_type, error: dataclasses.replace(
            plan, norm_type=norm_type, error_if_nonfinite=error
        ),
        plans,
        st.sampled_from(NORM_TYPES),
        st.booleans(),
    )


def _clipped(scenario: Scenario) -> Scenario:
    """``scenario`` clipping to 0.05 before each step (its norm type as it carries it)."""
    return dataclasses.replace(scenario, plan=dataclasses.replace(scenario.plan, clip=0.05))


def _clip_precisions(scenario: Scenario) -> bool:
    """The precisions the clipping check draws: fp32 and, but for model_parallel, the scaled
    16-mixed."""
    allowed = ("32-true", "16-mixed") if scenario.family != "model_parallel" else ("32-true",)
    return scenario.precision in allowed


@pytest.mark.clause("TRAIN-1")
@given(SELF_SHARDING.flatmap(lambda family: scenarios(family, plan=train_plans(max_steps=2))))
@example(TRAIN_ZOO)
def test_training_matches_the_unsharded_model(scenario: Scenario) -> None:
    results = run(train_rank, scenario, world_size=scenario.world_size)
    assert_parity(results, scenario)


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
    results = run(frozen_tied_rank, scenario, world_size=scenario.world_size)
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
    outs = run(no_sync_rank, scenario, world_size=scenario.world_size)
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


@pytest.mark.clause("SYNC-1", "CLIP-1")
@pytest.mark.parametrize("which", ["no_backward_sync", "clip_gradients_norm"])
@pytest.mark.parametrize("family", ["fsdp", "model_parallel", "fsdp2"])
def test_a_module_that_is_not_a_sharded_root_is_refused(family: str, which: str) -> None:
    clause_id = "SYNC-1" if which == "no_backward_sync" else "CLIP-1"
    for rank, outcome in enumerate(run(type_error_rank, family, which, world_size=job_world())):
        assert outcome.startswith("TypeError"), (
            f"rank {rank}: {clause_id}: {which} on a plain nn.Linear gave {outcome!r}, "
            "expected TypeError"
        )


@pytest.mark.clause("CLIP-1")
# every norm_type and error_if_nonfinite (harness.clauses.ARGUMENTS) on each family, by
# construction; the configurations are the whole-configuration-space rows'
@covering_examples("CLIP-1", keep=_clip_precisions, adapt=_clipped, configurations=False)
@given(
    FAMILIES.flatmap(
        lambda family: scenarios(
            family,
            sharding=SHARDING_STRATEGIES,
            precisions=("32-true", "16-mixed") if family != "model_parallel" else ("32-true",),
            plan=_clip_arguments(train_plans(clip=True)),
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
    # the scaling against the strategy's own norms, then the norms against the plain model's:
    # a wrong scaling or norm changes every norm, loss and parameter after it
    assert_clipped(results, scenario)
    ref = reference_run(scenario)
    for r in results:
        assert_close(
            torch.tensor(r.norms),
            torch.tensor(ref.norms),
            scenario_tolerance(scenario),
            name=f"rank {r.rank}: clip norms of norm_type={scenario.plan.norm_type}",
        )
    assert_parity(results, scenario, ref, grads=True)


def _unsharded_norm(scenario: Scenario, poison: float) -> float:
    """What ``torch.nn.utils.clip_grad_norm_`` returns on the unsharded model's gradients of
    the first micro-batch with one element set to ``poison``, with the scenario's
    ``norm_type`` and ``error_if_nonfinite=False`` (after checking that with True it raises)."""
    grads = [g for g in _local_grads(scenario, 0).values() if g.numel() > 0]
    grads[0].view(-1)[0] = poison
    holders = []
    for grad in grads:
        holder = torch.zeros_like(grad)
        holder.grad = grad
        holders.append(holder)
    norm_type = scenario.plan.norm_type
    with pytest.raises(RuntimeError):
        torch.nn.utils.clip_grad_norm_(holders, NONFINITE_MAX_NORM, norm_type, True)
    norm = torch.nn.utils.clip_grad_norm_(
        holders, NONFINITE_MAX_NORM, norm_type, error_if_nonfinite=False
    )
    return float(norm)


def _same_float(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


@pytest.mark.clause("CLIP-1")
# every norm_type on each family, by construction (the job passes both error_if_nonfinite)
@covering_examples("CLIP-1", keep=lambda s: s.precision == "32-true", configurations=False)
@given(
    FAMILIES.flatmap(
        lambda family: scenarios(
            family, sharding=SHARDING_STRATEGIES, plan=_clip_arguments(train_plans())
        )
    )
)
def test_a_nonfinite_norm_raises_on_every_rank_and_leaves_gradients(scenario: Scenario) -> None:
    outs = run(nonfinite_rank, scenario, world_size=scenario.world_size)
    norm_type = scenario.plan.norm_type
    tol = scenario_tolerance(scenario)
    for rank, out in enumerate(outs):  # the ordinary clip first: the edges build on it
        where = f"rank {rank}, an ordinary clip of finite gradients, norm_type={norm_type}"
        finite = out["finite"]
        assert_clip_scales(where, finite["norm"], finite["scaled"], FINITE_MAX_NORM, tol)
    for rank, out in enumerate(outs):
        assert out["zero"].startswith("ValueError") and "0" in out["zero"], (
            f"rank {rank}: norm_type=0 is no norm: clip_gradients_norm must raise ValueError "
            f"naming it; it gave {out['zero']!r}"
        )
        assert out["zero_unchanged"], f"rank {rank}: the refused norm_type=0 changed gradients"
    for poison in ("inf", "nan"):
        expected = _unsharded_norm(scenario, float(poison))
        coef = torch.clamp(NONFINITE_MAX_NORM / (torch.tensor(expected) + 1e-6), max=1.0)
        for rank, out in enumerate(outs):
            seen = out[poison]
            where = f"rank {rank}, a gradient holding {poison}, norm_type={norm_type}"
            assert seen["raised"].startswith("RuntimeError"), (
                f"{where}: a non-finite total norm with error_if_nonfinite=True gave "
                f"{seen['raised']!r}, expected RuntimeError on every rank"
            )
            assert seen["unchanged"], (
                f"{where}: gradients were scaled although the norm is not finite"
            )
            assert _same_float(seen["norm"], expected), (
                f"{where}: error_if_nonfinite=False returned {seen['norm']}; "
                f"torch.nn.utils.clip_grad_norm_ on the unsharded gradients returns {expected}"
            )
            pairs = zip(seen["before"], seen["after"], strict=True)
            for index, (before, after) in enumerate(pairs):
                wanted = before * coef.to(before.dtype)
                assert torch.equal(after.isnan(), wanted.isnan()) and torch.equal(
                    after.nan_to_num(), wanted.nan_to_num()
                ), (
                    f"{where}: with error_if_nonfinite=False local gradient {index} became "
                    f"{after.reshape(-1)[:4].tolist()}...; torch scales it by {coef.item()} "
                    f"(min(1, max_norm / (norm + 1e-6))): {wanted.reshape(-1)[:4].tolist()}..."
                )


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
    for rank, out in enumerate(run(init_rank, scenario, world_size=scenario.world_size)):
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
