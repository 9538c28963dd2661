"""The contract methods' arguments as axes: how the suites write, declare, carry and cover them."""

from __future__ import annotations

import dataclasses
import math

import pytest

from harness.clauses import ARGUMENTS, CLAUSES
from suites.lib.controller.clause_covers import argument_cover, argument_rows, covering_examples
from suites.lib.controller.dispatch import exercised
from suites.lib.controller.regressions import CLIP_FSDP2, SYNC_NESTED
from suites.lib.ranks.checkpoint_refusal_jobs import non_strict_rank, save_contract_rank
from suites.lib.ranks.training import train_rank
from suites.lib.ranks.training_jobs import nonfinite_rank, type_error_rank
from suites.lib.shared.arguments import (
    DECLARED,
    DRAWN,
    argument_value,
    arguments,
    carried_arguments,
    passed_by,
    plan_arguments,
    with_arguments,
)
from suites.lib.shared.axes import scenario_axes
from suites.lib.shared.specs import Scenario

WORLDS = (1, 2, 3, 4)


def test_values_are_written_as_the_contract_declares_them() -> None:
    assert [argument_value("norm_type", v) for v in (2.0, 1, math.inf, 1.5, 0.0)] == [
        "2",
        "1",
        "inf",
        "1.5",
        "0",
    ]
    assert argument_value("empty_init", None) == "None"
    assert argument_value("strict", False) == "False"
    assert argument_value("reduce_op", "mean") == "mean"
    assert argument_value("storage_options", {"x": 1}) == "given"
    assert argument_value("filter", None) == "None"
    assert [argument_value("src", r) for r in (0, 3)] == ["0", "non-zero"]
    with pytest.raises(KeyError, match="not an argument of the contract"):
        argument_value("max_norm", 1.0)
    assert arguments(enabled=(True, False, True), strict=True) == {
        "enabled": ("True", "False"),
        "strict": ("True",),
    }
    assert DECLARED == {a.name: a.values for a in ARGUMENTS}
    for name, values in DECLARED.items():  # every declared value can be written
        assert all(argument_value(name, v) == v for v in values if v not in ("given", "non-zero"))


def test_jobs_report_what_they_pass_beside_their_configuration_axes() -> None:
    clip = plan_arguments(CLIP_FSDP2)
    assert clip == {
        "empty_init": ("False",),
        "enabled": ("False",),
        "norm_type": ("2",),
        "error_if_nonfinite": ("True",),
    }
    accumulating = plan_arguments(SYNC_NESTED)  # two micro-batches, no clipping
    assert accumulating == {"empty_init": ("False",), "enabled": ("True", "False")}
    assert passed_by(train_rank, (CLIP_FSDP2,)) == clip
    assert exercised(train_rank, (CLIP_FSDP2,)) == [{**scenario_axes(CLIP_FSDP2), **clip}]
    edges = passed_by(nonfinite_rank, (with_arguments(CLIP_FSDP2, {"norm_type": "inf"}),))
    assert edges["norm_type"] == ("0", "inf") and edges["error_if_nonfinite"] == ("True", "False")
    # a job without a scenario reports its arguments alone
    assert exercised(type_error_rank, ("fsdp", "clip_gradients_norm")) == [
        {"enabled": ("False",), "norm_type": ("2",), "error_if_nonfinite": ("True",)}
    ]
    assert passed_by(save_contract_rank, ("fsdp", "/x"))["storage_options"] == ("None", "given")
    assert passed_by(non_strict_rank, (None, "/x", None)) == {"strict": ("False",)}
    assert passed_by(len, ((),)) == {}  # a job that declares nothing


def test_a_scenario_carries_the_drawn_arguments() -> None:
    row = {"norm_type": "1.5", "error_if_nonfinite": "False", "empty_init": "True"}
    carried = with_arguments(CLIP_FSDP2, row)
    assert carried.plan.norm_type == 1.5 and carried.plan.error_if_nonfinite is False
    assert carried.empty_init is True
    assert carried_arguments(carried) == row
    assert set(carried_arguments(CLIP_FSDP2)) == set(DRAWN)
    for bad in ({"strict": "True"}, {"empty_init": "None"}):
        with pytest.raises(ValueError, match="cannot carry"):
            with_arguments(CLIP_FSDP2, bad)


def test_argument_rows_take_every_value_of_the_scope_in_as_few_rows_as_the_widest() -> None:
    rows = argument_rows("CLIP-1")
    assert len(rows) == 4
    scope = dict(CLAUSES["CLIP-1"].scope)
    for name in ("norm_type", "error_if_nonfinite"):
        assert {row[name] for row in rows} == set(scope[name])
    assert argument_rows("INIT-1") == [{"empty_init": "True"}]
    assert argument_rows("TRAIN-1") == []  # its scope names no argument
    assert argument_rows("CKPT-STRICT-1") == []  # strict is passed by construction


def test_the_argument_cover_takes_every_value_on_each_family_where_shards_are_reduced() -> None:
    cover = argument_cover(WORLDS, "CLIP-1")
    assert len(cover) == 3 * len(argument_rows("CLIP-1"))
    for family in ("fsdp", "model_parallel", "fsdp2"):
        mine = [s for s in cover if s.family == family]
        assert {s.plan.norm_type for s in mine} == {2.0, 1.0, math.inf, 1.5}
        assert all(s.shard_factor >= 2 for s in mine)
    assert argument_cover(WORLDS, "TRAIN-1") == ()
    assert all(s.world_size == 1 for s in argument_cover((1,), "CLIP-1"))  # --nproc 1


def test_covering_examples_refuse_an_adapt_that_changes_the_drawn_arguments() -> None:
    def flip(s: Scenario) -> Scenario:
        return dataclasses.replace(s, plan=dataclasses.replace(s.plan, norm_type=7.0))

    with pytest.raises(ValueError, match="adapt changed the arguments"):
        covering_examples("CLIP-1", adapt=flip, configurations=False)
