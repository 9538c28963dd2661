"""The single-process reference and the comparison helpers."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from suites.lib.controller.oracles import (
    assert_clip_scales,
    assert_clipped,
    assert_close,
    assert_close_state,
    assert_same_on_ranks,
    named_optim_state,
    reference_run,
    scenario_tolerance,
)
from suites.lib.controller.tolerances import EXACT, Tolerance
from suites.lib.ranks.readers import scaling
from suites.lib.ranks.training import RankResult
from suites.lib.shared.models import BlockSpec, ModelSpec, build_model, make_batch
from suites.lib.shared.specs import FSDPConfig, OptimSpec, Scenario, TrainPlan

SPEC = ModelSpec(hidden=4, blocks=(BlockSpec(ffn=3),), in_features=3, out=2, seed=5)


def _scenario(world: int, plan: TrainPlan, optim: OptimSpec | None = None) -> Scenario:
    return Scenario(world, SPEC, FSDPConfig(), optim or OptimSpec("sgd", lr=0.1), plan)


def test_reference_is_plain_training_on_the_concatenated_batch() -> None:
    plan = TrainPlan(steps=2, micro_batches=1, batch_size=2, data_seed=3)
    ref = reference_run(_scenario(2, plan))
    model = build_model(SPEC)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(2):
        opt.zero_grad()
        batches = [make_batch(SPEC, 3, step, 0, r, 2) for r in range(2)]
        x, y = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
        F.mse_loss(model(x), y).backward()  # equal batch sizes: mean of means == mean
        opt.step()
    assert_close_state(ref.state, model.state_dict(), Tolerance(1e-6, 1e-7))
    assert len(ref.losses) == 2 and len(ref.losses[0][0]) == 2


def test_accumulation_equals_one_big_batch() -> None:
    split = reference_run(_scenario(2, TrainPlan(steps=1, micro_batches=2, batch_size=2)))
    assert len(split.losses[0]) == 2
    whole_norms = reference_run(_scenario(2, TrainPlan(steps=1, clip=1e9))).norms
    assert whole_norms and whole_norms[0] > 0


def test_clip_reports_the_unclipped_norm() -> None:
    ref = reference_run(_scenario(2, TrainPlan(steps=1, clip=1e-3)))
    total = torch.linalg.vector_norm(
        torch.stack([g.norm() for g in ref.grads.values() if g is not None])
    )
    assert ref.norms[0] > 1e-3 and float(total) == pytest.approx(1e-3, rel=1e-3)


def test_assert_close_names_worst_element_and_values() -> None:
    expected = torch.zeros(2, 3)
    actual = expected.clone()
    actual[1, 2] = 0.5
    actual[0, 0] = 0.1
    with pytest.raises(
        AssertionError,
        match=r"parameter 'w': 2 of 6 elements differ; worst at "
        r"index \(1, 2\): actual=0.5, expected=0",
    ):
        assert_close(actual, expected, Tolerance(0, 1e-3, reason="r"), name="parameter 'w'")
    assert_close(actual, actual.clone(), EXACT, name="x")
    with pytest.raises(AssertionError, match="shape"):
        assert_close(actual, expected[0], EXACT, name="x")
    nan = expected.clone()
    nan[0, 1] = float("nan")
    with pytest.raises(AssertionError, match=r"index \(0, 1\): actual=nan"):
        assert_close(nan, expected, Tolerance(1, 1), name="x")


def test_state_comparisons() -> None:
    a = {"w": torch.ones(2)}
    with pytest.raises(AssertionError, match=r"missing .*\['v'\]"):
        assert_close_state(a, {"w": torch.ones(2), "v": torch.ones(1)}, EXACT)
    with pytest.raises(AssertionError, match="'w' on rank 1"):
        assert_same_on_ranks([a, {"w": torch.tensor([1.0, 2.0])}], what="parameter")


def test_named_optimizer_state_and_tolerance() -> None:
    model = build_model(SPEC)
    opt = OptimSpec("adam", lr=0.01, groups="by_kind").build(model.named_parameters())
    model(torch.randn(2, 3)).sum().backward()
    opt.step()
    state = named_optim_state(model, opt)
    assert set(state["state"]) == {n for n, _ in model.named_parameters()}
    assert state["param_groups"][0]["params"][0] == "inp.weight"
    scenario = _scenario(2, TrainPlan(steps=3), OptimSpec("adam", lr=0.01))
    assert scenario_tolerance(scenario).atol > 1e-5


def test_integer_state_is_compared_exactly_dtype_included() -> None:
    loose = Tolerance(0.5, 10.0)
    assert_close(torch.tensor(7), torch.tensor(7), loose, name="n")
    with pytest.raises(AssertionError, match=r"n: torch.int64 8 where the reference holds"):
        assert_close(torch.tensor(8), torch.tensor(7), loose, name="n")
    with pytest.raises(AssertionError, match="dtype included"):
        assert_close(torch.tensor(7.0), torch.tensor(7), loose, name="n")


def test_the_reference_updates_running_statistics_once_per_micro_batch() -> None:
    spec = ModelSpec(hidden=6, blocks=(BlockSpec(ffn=4),), running_stats=True, seed=2)
    plan = TrainPlan(steps=1, micro_batches=3, batch_size=2)

    def run(world: int) -> dict[str, torch.Tensor]:
        scenario = Scenario(world, spec, FSDPConfig(), OptimSpec("sgd", lr=0.1), plan)
        ref = reference_run(scenario)
        start = int(ref.initial["bn.num_batches_tracked"])
        assert int(ref.state["bn.num_batches_tracked"]) == start + 3  # not 3 x world
        return ref.state

    # every data-parallel rank sees the same inputs: each updates as one rank alone would
    one, four = run(1), run(4)
    for key in ("bn.running_mean", "bn.running_var"):
        assert torch.equal(four[key], one[key]), key


def test_clip_scaling_is_checked_against_the_strategys_own_norm() -> None:
    tol = Tolerance(1e-4, 1e-5, reason="fp32")
    assert_clip_scales("rank 0, step 0", 4.0, 0.5 / (4.0 + 1e-6), 0.5, tol)  # scaled right
    assert_clip_scales("rank 0, step 0", 0.2, 1.0, 0.5, tol)  # below max_norm: unscaled
    assert_clip_scales("rank 1, step 0", 4.0, None, 0.5, tol)  # this rank held no gradient
    assert_clip_scales("rank 0, step 0", math.inf, 0.0, 0.5, tol)  # compared element-wise
    with pytest.raises(AssertionError) as caught:
        assert_clip_scales("rank 0, step 0", 4.0, 1.0, 0.5, tol)
    message = str(caught.value)
    assert message.startswith("rank 0, step 0: gradients[…]: scaled by 1 in clip_gradients_norm")
    assert "returned the norm 4" in message and "= 0.125" in message


def test_clip_scaling_of_a_run_fails_at_its_first_wrong_step_with_the_clause() -> None:
    plan = TrainPlan(steps=2, micro_batches=1, batch_size=2, data_seed=3, clip=0.5)
    scenario = _scenario(2, plan)
    right = 0.5 / (4.0 + 1e-6)
    results = [
        RankResult(rank=0, dp_rank=0, norms=[4.0, 3.0], scaled=[right, 1.0]),
        RankResult(rank=1, dp_rank=1, norms=[4.0, 3.0], scaled=[1.0, 1.0]),
    ]
    with pytest.raises(AssertionError, match=r"^CLIP-1: rank 1, step 0: gradients\[…\]: scaled"):
        assert_clipped(results, scenario, clause_id="CLIP-1")
    unclipped = _scenario(2, TrainPlan(steps=2, micro_batches=1, batch_size=2, data_seed=3))
    assert_clipped(results, unclipped)  # a plan without clipping has nothing to check


def test_scaling_reads_the_factor_of_this_ranks_gradients() -> None:
    before = [torch.tensor([3.0, 4.0]), torch.zeros(0)]
    assert scaling(before, [g * 0.25 for g in before]) == pytest.approx(0.25)
    assert scaling(before, before) == pytest.approx(1.0)
    assert scaling([torch.zeros(3)], [torch.zeros(3)]) is None
    assert scaling([], []) is None
