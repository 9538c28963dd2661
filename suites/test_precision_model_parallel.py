"""CONTRACT.md PREC-3 (with TRAIN-1, MP-2) for the model_parallel family:
``bf16-true``/``16-true``.

PREC-3 names no family, so a model_parallel strategy that accepts a true low precision
(CFG-7) must create the model's parameters in the low dtype inside ``module_init_context``,
keep them (DTensor shards included) in that dtype through ``setup_module``, compute in it,
and hold optimizer state in it. A strategy that cannot apply the precision declares it
``Unsupported`` (PREC-2, CFG-10), which the suite records instead of failing. Parity with
the plain model in the same dtype (TRAIN-1, MP-2) is checked within the precision's
tolerance.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from suites.lib.controller.dispatch import run
from suites.lib.controller.oracles import assert_parity
from suites.lib.controller.scenarios import examples, scenarios, train_plans
from suites.lib.ranks.precision_jobs import true_low_dtype_rank
from suites.lib.ranks.training import (
    train_rank,
)
from suites.lib.shared.specs import Scenario

LOW = {"bf16-true": torch.bfloat16, "16-true": torch.float16}


def _with_precision(scenario: Scenario, precision: str) -> Scenario:
    """``scenario`` under ``precision`` (the zoo's model_parallel draws only fp32 masters);
    fp16 Adam gets ``eps=1e-4`` as :func:`suites.lib.controller.scenarios.optim_specs` gives it."""
    strategy = dataclasses.replace(scenario.strategy, precision=precision)
    optim = scenario.optim
    if precision.startswith("16"):
        optim = dataclasses.replace(optim, eps=1e-4)
    return dataclasses.replace(scenario, strategy=strategy, optim=optim)


def true_scenarios(
    optimizers: tuple[str, ...], plan: st.SearchStrategy[Any] | None = None
) -> st.SearchStrategy[Scenario]:
    """model_parallel scenarios under ``bf16-true`` or ``16-true``.

    Args:
        optimizers: optimizer kinds to draw from.
        plan: training plans (the scenarios' default when None).
    """
    return st.sampled_from(tuple(LOW)).flatmap(
        lambda precision: scenarios("model_parallel", optimizers=optimizers, plan=plan).map(
            lambda s: _with_precision(s, precision)
        )
    )


@pytest.mark.clause("PREC-3")
@given(true_scenarios(optimizers=("adam", "adamw")))
def test_true_low_precision_keeps_model_parallel_parameters_and_state_low(
    scenario: Scenario,
) -> None:
    low = str(LOW[scenario.precision])
    outs = run(true_low_dtype_rank, scenario, world_size=scenario.world_size)
    for rank, out in enumerate(outs):
        where = f"PREC-3: rank {rank} (model_parallel, {scenario.precision})"
        assert out["created"] == [low], (
            f"{where}: parameters created in module_init_context are {out['created']}"
        )
        assert out["setup"] == [low], f"{where}: parameters after setup_module are {out['setup']}"
        assert out["compute"] == {"weight": low, "output": low}, (
            f"{where}: a Linear computed with {out['compute']}"
        )
        assert out["grads"] in ([], [low]), f"{where}: gradients are {out['grads']}"
        assert out["optim"] in ([], [low]), f"{where}: optimizer state is {out['optim']}"
        assert out["stepped"] == [low], f"{where}: parameters after a step are {out['stepped']}"
    # a rank whose shard holds only frozen parameters has no state: look across ranks
    assert any(out["optim"] for out in outs), (
        f"PREC-3: no rank's optimizer holds floating state after a {scenario.optim.kind} step"
    )


@pytest.mark.clause("TRAIN-1", "MP-2", "PREC-3")
@examples(5)
@given(true_scenarios(optimizers=("sgd",), plan=train_plans()))
def test_true_low_precision_model_parallel_training_matches_within_its_tolerance(
    scenario: Scenario,
) -> None:
    results = run(train_rank, scenario, world_size=scenario.world_size)
    assert_parity(results, scenario)
