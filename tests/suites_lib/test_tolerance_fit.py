"""The tolerance table holds, with margin, for single-process emulations of each precision.

A ``*-true`` run is emulated by training the model built in the low dtype (parameters,
gradients and optimizer state low); a ``*-mixed`` run by a low-dtype copy doing forward and
backward whose gradients, rounded to the low dtype as a low-dtype reduction leaves them, step
float32 master parameters. Each is compared with ``reference_run`` exactly as the suites
compare a strategy; the worst ratio ``|diff| / allowed`` must stay below 1/2, so the table
keeps a 2x margin over what low precision alone does to these scenarios.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings

from suites.lib.controller.oracles import reference_run, scenario_tolerance
from suites.lib.controller.scenarios import scenarios, train_plans
from suites.lib.shared.models import build_model, make_batch
from suites.lib.shared.specs import Scenario

LOW = {"bf16": torch.bfloat16, "16": torch.float16}
MARGIN = 0.5


def _emulate(scenario: Scenario) -> dict[str, torch.Tensor]:
    precision, plan, dp = scenario.precision, scenario.plan, scenario.dp_size
    low = LOW[precision.split("-")[0]]
    if precision.endswith("-true"):
        previous = torch.get_default_dtype()
        torch.set_default_dtype(low)
        try:
            model = build_model(scenario.model)
        finally:
            torch.set_default_dtype(previous)
        compute = model
    else:
        model = build_model(scenario.model)
        compute = copy.deepcopy(model).to(low)
    optimizer = scenario.optim.build(model.named_parameters())
    pairs = list(zip(model.parameters(), compute.parameters(), strict=True))
    for step in range(plan.steps):
        for micro in range(plan.micro_batches):
            for r in range(dp):
                x, y = make_batch(scenario.model, plan.data_seed, step, micro, r, plan.batch_size)
                x = x if x.dtype == torch.int64 else x.to(low)
                loss = F.mse_loss(compute(x).float(), y) * plan.loss_scale
                (loss / (dp * plan.micro_batches)).backward()
        if compute is not model:
            for master, copy_ in pairs:
                if copy_.grad is not None:
                    master.grad = copy_.grad.to(low).float()
                    copy_.grad = None
        optimizer.step()
        optimizer.zero_grad()
        if compute is not model:
            with torch.no_grad():
                for master, copy_ in pairs:
                    copy_.copy_(master)
    return {k: v.float() for k, v in model.state_dict().items()}


def _worst_ratio(scenario: Scenario) -> float:
    expected = reference_run(scenario).state
    actual = _emulate(scenario)
    tol = scenario_tolerance(scenario)
    worst = 0.0
    for key, e in expected.items():
        allowed = tol.atol + tol.rtol * e.double().abs()
        worst = max(worst, float(((actual[key].double() - e.double()).abs() / allowed).max()))
    return worst


@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed", "bf16-true", "16-true"])
def test_table_covers_low_precision_with_margin(precision: str) -> None:
    torch.set_num_threads(1)
    ratios: list[float] = []

    optimizers = ("sgd",) if precision == "16-true" else ("sgd", "adam", "adamw")

    @settings(
        max_examples=40,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(
        scenarios(
            "fsdp", precisions=(precision,), optimizers=optimizers, plan=train_plans(max_steps=3)
        )
    )
    def check(scenario: Scenario) -> None:
        ratios.append(_worst_ratio(scenario))
        assert ratios[-1] <= MARGIN, f"{precision}: |diff|/allowed = {ratios[-1]:.3f}"

    check()
    print(f"{precision}: worst |diff|/allowed over {len(ratios)} scenarios: {max(ratios):.3f}")
