"""CONTRACT.md PREC-1..PREC-4 (and TRAIN-1 per precision): dtypes of parameters, gradients,
optimizer state, compute and buffers; the sharded gradient scaler; parity within each
precision's tolerance.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from suites.lib.controller.clause_covers import covering_examples
from suites.lib.controller.dispatch import run
from suites.lib.controller.oracles import (
    assert_close,
    assert_close_state,
    assert_parity,
    assert_same_on_ranks,
    expected_dtypes,
    half_dtype,
    reference_run,
)
from suites.lib.controller.scenarios import scenarios, train_plans
from suites.lib.controller.tolerances import EXACT
from suites.lib.ranks.precision_jobs import buffer_rank, dtype_rank, skip_rank
from suites.lib.ranks.training import train_rank
from suites.lib.shared.models import build_model
from suites.lib.shared.specs import Scenario

FAMILIES = st.sampled_from(["fsdp", "model_parallel", "fsdp2"])
#: the families that apply the precision themselves (all five precisions)
SELF_SHARDING = st.sampled_from(["fsdp", "fsdp2"])
#: the mixed precisions of the model_parallel family's checks
MP_PRECISIONS = ("bf16-mixed",)
SHARDINGS = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD")


def _check_dtypes(scenario: Scenario, grads: bool) -> list[dict[str, Any]]:
    outs = run(dtype_rank, scenario, world_size=scenario.world_size)
    want = {k: str(v) for k, v in expected_dtypes(scenario.precision).items()}
    for rank, out in enumerate(outs):
        where = f"rank {rank} ({scenario.precision})"
        assert out["params"] == [want["stored"]], f"{where}: sharded parameters {out['params']}"
        assert out["optim"] in ([], [want["stored"]]), f"{where}: optimizer state {out['optim']}"
        assert out["compute"]["weight"] == want["compute"], (
            f"{where}: a Linear computed with {out['compute']['weight']} weights"
        )
        assert out["compute"]["output"] == want["compute"], (
            f"{where}: a Linear's output was {out['compute']['output']}"
        )
        if grads:
            assert out["grads"] in ([], [want["stored"]]), f"{where}: gradients {out['grads']}"
    stateful = scenario.optim.kind != "sgd" or scenario.optim.momentum > 0
    # a rank whose shard holds only frozen parameters has no state: look across ranks
    assert not stateful or any(out["optim"] for out in outs), (
        f"no rank's optimizer holds floating state after a {scenario.optim.kind} step"
    )
    return outs


@pytest.mark.clause("PREC-1")
@given(FAMILIES.flatmap(lambda f: scenarios(f, sharding=SHARDINGS, optimizers=("adam", "sgd"))))
def test_fp32_keeps_everything_float32(scenario: Scenario) -> None:
    _check_dtypes(scenario, grads=True)


@pytest.mark.clause("PREC-2")
@given(
    FAMILIES.flatmap(
        lambda family: scenarios(
            family,
            sharding=SHARDINGS,
            precisions=MP_PRECISIONS if family == "model_parallel" else ("bf16-mixed", "16-mixed"),
            optimizers=("adam", "adamw"),
        )
    )
)
def test_mixed_precision_keeps_float32_masters_and_computes_low(scenario: Scenario) -> None:
    outs = _check_dtypes(scenario, grads=False)
    if scenario.family != "model_parallel":
        low = str(half_dtype(scenario.precision))
        for rank, out in enumerate(outs):
            assert out["reduce"] == [low], f"rank {rank}: FSDP reduce dtypes {out['reduce']}"


@pytest.mark.clause("PREC-3")
@given(
    SELF_SHARDING.flatmap(
        lambda family: scenarios(
            family, sharding=SHARDINGS, precisions=("bf16-true", "16-true"), optimizers=("adam",)
        )
    )
)
def test_true_low_precision_creates_low_parameters_and_state(scenario: Scenario) -> None:
    _check_dtypes(scenario, grads=True)


@pytest.mark.clause("TRAIN-1", "PREC-2", "PREC-3")
@given(
    st.tuples(
        st.sampled_from(("bf16-mixed", "16-mixed", "bf16-true", "16-true")), SELF_SHARDING
    ).flatmap(
        lambda drawn: scenarios(
            drawn[1],
            sharding=SHARDINGS,
            precisions=(drawn[0],),
            # fp16 Adam's second moment underflows: see suites/lib/controller/tolerances.py
            optimizers=("sgd",) if drawn[0] == "16-true" else ("sgd", "adam", "adamw"),
            plan=train_plans(),
        )
    )
)
def test_low_precision_training_matches_within_its_tolerance(scenario: Scenario) -> None:
    results = run(train_rank, scenario, world_size=scenario.world_size)
    assert_parity(results, scenario)


@pytest.mark.clause("PREC-2")
@given(
    SELF_SHARDING.flatmap(
        lambda family: scenarios(family, sharding=SHARDINGS, precisions=("16-mixed",), frozen=False)
    )
)
def test_grad_scaler_skips_the_step_on_every_rank(scenario: Scenario) -> None:
    outs = run(skip_rank, scenario, world_size=scenario.world_size)
    for rank, out in enumerate(outs):
        assert_close_state(
            out["skipped"], out["initial"], EXACT, what=f"rank {rank}: after an inf on rank 0"
        )
        moved = [k for k in out["stepped"] if not torch.equal(out["stepped"][k], out["initial"][k])]
        assert moved, f"rank {rank}: the next, finite step changed no parameter"
    assert_same_on_ranks([out["stepped"] for out in outs], what="parameter after the next step")


@pytest.mark.clause("PREC-4")
@covering_examples("PREC-4", keep=lambda s: s.model.scale)
@given(
    SELF_SHARDING.flatmap(
        lambda family: scenarios(
            family,
            sharding=SHARDINGS,
            precisions=("32-true", "bf16-mixed", "16-mixed", "bf16-true"),
            scale=True,
            running_stats=None,
        )
    )
)
def test_buffers_compute_low_but_are_saved_as_stored(scenario: Scenario) -> None:
    want = expected_dtypes(scenario.precision)
    # a mixed precision may compute with buffers in the low dtype (FSDP's buffer_dtype) or
    # keep them at their stored dtype; either way they are saved as stored, bit for bit
    compute = {str(want["compute"]), str(want["stored"])}
    compute = {c.replace("torch.", "") for c in compute}
    stored = (str(want["stored"]), (scenario.model.hidden,))
    start = reference_run(scenario, steps=0).initial
    initial = start["scale.scale"]
    plain = build_model(scenario.model, "meta")
    persistent = {n: b for n, b in plain.named_buffers() if n in plain.state_dict()}
    for rank, out in enumerate(run(buffer_rank, scenario, world_size=scenario.world_size)):
        # every persistent buffer (a BatchNorm's mean, variance and counter too) as stored
        for name, b in persistent.items():
            dtype = str(want["stored"]) if b.is_floating_point() else str(b.dtype)
            assert out["layout"].get(name) == (dtype, tuple(b.shape)), (
                f"rank {rank}: the state dict holds {name!r} as {out['layout'].get(name)}, "
                f"stored as {(dtype, tuple(b.shape))}"
            )
            assert out["written"].get(name) == (dtype, tuple(b.shape)), (
                f"rank {rank}: the full checkpoint file holds {name!r} as "
                f"{out['written'].get(name)}, stored as {(dtype, tuple(b.shape))}"
            )
        for name, count in out["counters"].items():  # one training forward: one update
            expected = start[name] + int(name.endswith("num_batches_tracked"))
            assert_close(count, expected, EXACT, name=f"rank {rank}: counter {name!r}")
        assert out["seen"] in compute, (
            f"rank {rank}: the buffer 'scale.scale' was {out['seen']} during the forward; "
            f"{scenario.precision} computes with buffers in {sorted(compute)}"
        )
        assert out["saved"] == stored, (
            f"rank {rank}: the state dict holds 'scale.scale' as {out['saved']}, stored as {stored}"
        )
        # the buffer is not trained: it only moved, so it must come back bit for bit
        assert_close(out["value"], initial, EXACT, name=f"rank {rank}: buffer 'scale.scale'")
        assert not out["offset_saved"], f"rank {rank}: the non-persistent 'scale.offset' saved"
