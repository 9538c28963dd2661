"""The suites' pairwise cover: every pair of the declared space is taken by a row."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from harness.clauses import CLAUSES, WORD_AXES
from harness.conformance.output.coverage import in_scope, pairs_of, values_of
from suites.lib.controller.clause_covers import (
    covering_examples,
    covering_rows,
    other_family_plan,
    reshard_plan,
    value_cover,
    widest_row,
)
from suites.lib.controller.covering import (
    COVER_MODELS,
    candidates,
    cover_rows,
    greedy_cover,
    relative_cost,
    universe,
)
from suites.lib.controller.scenarios import valid_wrap
from suites.lib.shared.axes import scenario_axes
from suites.lib.shared.models import tp_widths
from suites.lib.shared.specs import FSDP2Config, FSDPConfig, MPConfig

WORLDS = (1, 2, 3, 4)


def test_the_rows_take_every_pair_of_the_space_and_are_far_fewer_than_the_candidates() -> None:
    rows = cover_rows(WORLDS)
    taken = set().union(*(pairs_of(row.axes()) for row in rows))
    assert taken >= universe(WORLDS)  # and the one row that reshards to an int
    assert sum(not isinstance(getattr(r.scenario.strategy, "reshard_after_forward", True), bool)
               for r in rows) == 1  # fmt: skip
    assert len(rows) < len(candidates(WORLDS)) // 20
    assert {row.scenario.family for row in rows} == {"fsdp", "model_parallel", "fsdp2"}
    assert {row.fmt for row in rows} == {"full", "sharded"}


def test_a_family_added_later_leaves_the_earlier_families_rows_as_they_were() -> None:
    """Row ids are check ids (expected-failures files list them): fsdp and model_parallel get
    the rows the cover of their own candidates gives, whatever fsdp2 adds."""
    early = [row for row in candidates(WORLDS) if row.scenario.family != "fsdp2"]
    pairs = [frozenset(pairs_of(row.axes())) for row in early]
    alone = greedy_cover(pairs, [relative_cost(row.scenario) for row in early])
    kept = [row.id for row in cover_rows(WORLDS) if row.scenario.family != "fsdp2"]
    assert kept == [early[i].id for i in alone]
    rows = value_cover(WORLDS, "TRAIN-1")
    assert [s.family for s in rows].index("fsdp2") == len([s for s in rows if s.family != "fsdp2"])


def test_the_space_holds_every_value_the_suites_draw_on_the_main_axes() -> None:
    values: dict[str, set[str]] = {}
    for first, a, second, b in universe(WORLDS):
        values.setdefault(first, set()).add(a)
        values.setdefault(second, set()).add(b)
    assert values["world_size"] == {"1", "2", "3", "4"}
    assert values["precision"] == {"32-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true"}
    assert {"FULL_SHARD", "NO_SHARD", "HYBRID_SHARD", "dp+tp", "tp", "dp"} <= values["sharding"]
    assert {"none", "size", "callable", "fully_shard root only", "module_fn"} <= values["wrap"]
    assert {"hsdp", "no reshard after forward"} <= values["sharding"]
    assert "reshard to 2" not in values["sharding"]  # see pairwise_candidates
    assert values["model"] == {
        "Block",
        "NestedBlock",
        "attention(hand)",
        "attention(mha)",
        "tied embedding",
        "frozen parameters",
        "buffers",
        "root parameter",
        "shared module",
        "running statistics",
    }


def test_rows_are_valid_configurations_with_stable_distinct_ids() -> None:
    rows = cover_rows(WORLDS)
    assert len({row.id for row in rows}) == len(rows)
    assert [row.id for row in rows] == [row.id for row in cover_rows.__wrapped__(WORLDS)]
    for row in rows:
        s = row.scenario
        assert s.model in COVER_MODELS
        if isinstance(s.strategy, (FSDPConfig, FSDP2Config)):
            assert valid_wrap(s.model, s.strategy.wrap), row.id
            mesh = s.strategy.device_mesh
            assert mesh is None or mesh[0] * mesh[1] == s.world_size, row.id
        else:
            assert isinstance(s.strategy, MPConfig)
            tp = s.strategy.tensor_parallel_size
            assert s.strategy.data_parallel_size * tp == s.world_size, row.id
            assert all(width % tp == 0 for width in tp_widths(s.model)), row.id
        if s.precision == "16-true":
            assert s.optim.kind == "sgd", row.id
        assert scenario_axes(s, row.fmt) == row.axes()


def test_a_smaller_world_gives_a_smaller_space_without_the_larger_sizes() -> None:
    small = universe((1, 2))
    assert small < universe(WORLDS)  # the same configurations, fewer world sizes
    assert not any(p[0] == "world_size" and p[1] in ("3", "4") for p in small)
    assert not any(p[2] == "world_size" and p[3] in ("3", "4") for p in small)


def _values(scenarios: list, scope: dict) -> dict[str, set[str]]:
    """The configuration values ``scenarios`` take inside ``scope`` (the contract's words, no
    configuration's values, left out: the covers do not take them)."""
    found: dict[str, set[str]] = {}
    for s in scenarios:
        for axis, values in scenario_axes(s).items():
            if axis in WORD_AXES:
                continue
            found.setdefault(axis, set()).update(v for v in values if v in scope.get(axis, values))
    return found


def test_a_value_cover_takes_every_value_of_the_clause_scope_in_few_scenarios() -> None:
    # fsdp (FULL_SHARD and SHARD_GRAD_OP), model_parallel (dp, tp, dp+tp) and fsdp2 (each
    # of its layouts)
    shard = value_cover(WORLDS, "SHARD-1")
    scope = dict(CLAUSES["SHARD-1"].scope)
    declared = in_scope(universe(WORLDS), scope)
    declared.pop("checkpoint")  # the value cover takes scenarios; formats are the caller's
    declared["sharding"] |= {"reshard to 2"}  # not paired: pairwise_candidates
    assert _values(list(shard), scope) == declared
    assert {s.family for s in shard} == {"fsdp", "model_parallel", "fsdp2"}
    # at least the eleven wrap kinds of the three families; preferring cheap rows may add
    # some
    assert 11 <= len(shard) <= 16
    both = value_cover(WORLDS, "TRAIN-1")  # no scope: three families, eleven wrap kinds
    every = {
        axis: values for axis, values in values_of(universe(WORLDS)).items() if axis != "checkpoint"
    }
    every["sharding"] = every["sharding"] | {"reshard to 2"}  # not paired: pairwise_candidates
    assert _values(list(both), {}) == every
    assert 11 <= len(both) <= 16  # at least the eleven wrap kinds; cheap rows may add some
    assert value_cover(WORLDS, "TRAIN-1") == both  # deterministic


def test_a_value_cover_keeps_only_what_the_check_can_run_and_honours_the_scope() -> None:
    tied = value_cover(WORLDS, "TRAIN-2", keep=lambda s: s.model.tied)
    assert tied and all(s.model.tied for s in tied)
    uneven = value_cover(WORLDS, "TRAIN-3")  # world sizes 2-4, layouts that split a parameter
    assert {s.world_size for s in uneven} == {2, 3, 4}
    assert not {"NO_SHARD", "one rank", "tp"} & {scenario_axes(s)["sharding"][0] for s in uneven}
    rt6 = value_cover(WORLDS, "CKPT-RT-6")
    assert {s.precision for s in rt6} == {"32-true", "bf16-mixed"}


def test_covering_examples_refuse_an_adapt_that_changes_the_axes() -> None:
    with pytest.raises(ValueError, match="adapt changed the axes"):
        covering_examples(
            "SHARD-1", adapt=lambda s: dataclasses.replace(s, world_size=s.world_size + 1)
        )


def test_covering_examples_replace_random_draws_and_keep_at_least_one() -> None:
    from hypothesis import given
    from hypothesis import strategies as st

    seen: list[object] = []

    @covering_examples("SHARD-1", share=3)
    @given(st.none())
    def check(scenario: object) -> None:
        seen.append(scenario)

    check()
    covering = [s for s in seen if s is not None]
    # every scenario of the value cover, as explicit examples
    assert len(covering) == len(value_cover(WORLDS, "SHARD-1"))
    assert len(seen) - len(covering) >= 1  # and at least one random draw


def test_covering_examples_split_one_cover_between_checks_by_part() -> None:
    from hypothesis import given
    from hypothesis import strategies as st

    seen: dict[str, list[object]] = {"fsdp": [], "model_parallel": [], "fsdp2": []}

    def check_of(family: str) -> Callable[[], None]:
        @covering_examples("SHARD-1", part=lambda s: s.family == family)
        @given(st.none())
        def check(scenario: object) -> None:
            if scenario is not None:
                seen[family].append(scenario)

        return check

    for family in seen:
        check_of(family)()
    # each check runs its family's rows of the one cover, and together they are the cover
    assert all(s.family == f for f, runs in seen.items() for s in runs)  # type: ignore[attr-defined]
    together = sorted(map(repr, [s for runs in seen.values() for s in runs]))
    assert together == sorted(map(repr, value_cover(WORLDS, "SHARD-1")))


def test_widest_adds_the_largest_world_to_a_part_that_lacks_it_and_nothing_else() -> None:
    from hypothesis import given
    from hypothesis import strategies as st

    seen: dict[str, list[object]] = {"fsdp": [], "fsdp2": []}

    def check_of(family: str) -> Callable[[], None]:
        @covering_examples("SHARD-1", part=lambda s: s.family == family, widest=True)
        @given(st.none())
        def check(scenario: object) -> None:
            if scenario is not None:
                seen[family].append(scenario)

        return check

    cover = value_cover(WORLDS, "SHARD-1")
    for family in seen:
        check_of(family)()
        rows = [s for s in cover if s.family == family]
        assert seen[family][: len(rows)] == rows, family  # the part's rows first, as without
    # the fsdp rows of the shared cover stop below 4 ranks (a model_parallel row takes 4):
    # one fsdp row more, at 4, sharding FULL_SHARD or SHARD_GRAD_OP four ways
    assert max(s.world_size for s in cover if s.family == "fsdp") < max(WORLDS)
    extra = widest_row(WORLDS, "SHARD-1", lambda s: s.family == "fsdp")
    assert extra is not None and extra.world_size == max(WORLDS) and extra.shard_factor == 4
    assert seen["fsdp"][-1] == extra
    assert len(seen["fsdp"]) == len([s for s in cover if s.family == "fsdp"]) + 1
    # fsdp2's rows already take 4 ranks: nothing more
    assert len(seen["fsdp2"]) == len([s for s in cover if s.family == "fsdp2"])


def test_reshard_and_other_family_plans_fit_the_options_to_the_load_side() -> None:
    for row in covering_rows("CKPT-RT-3"):
        plan = reshard_plan(row)
        assert plan is not None and plan.load.world_size != plan.save.world_size, row.id
        config = plan.load.strategy
        if isinstance(config, FSDPConfig) and config.device_mesh is not None:
            assert config.device_mesh[0] * config.device_mesh[1] == plan.load.world_size
        if isinstance(config, MPConfig):
            assert config.data_parallel_size == plan.load.world_size
    for row in covering_rows("CKPT-RT-6", formats=("full",)):
        plan = other_family_plan(row)
        assert plan.load.family != plan.save.family, row.id
        assert plan.load.world_size == plan.save.world_size
        assert plan.load.precision == plan.save.precision


def test_greedy_cover_takes_every_element_and_prefers_the_cheaper_of_equal_sets() -> None:
    values = [frozenset({1, 2}), frozenset({1, 2}), frozenset({3}), frozenset({1, 2, 3})]
    assert greedy_cover(values, [4.0, 1.0, 1.0, 100.0]) == [1, 2]  # not the costly {1, 2, 3}
    assert greedy_cover(values, [1.0, 1.0, 1.0, 1.0]) == [3]  # the most elements at one cost
    assert greedy_cover([], []) == []


def test_relative_cost_grows_with_ranks_and_model_parallel_meshes() -> None:
    by_id = {row.id: row.scenario for row in candidates(WORLDS)}
    costs = {
        layout: min(relative_cost(s) for i, s in by_id.items() if layout in i)
        for layout in ("fsdp-FULL_SHARD", "dp1xtp1", "dp2xtp1", "dp2xtp2")
    }
    assert costs["fsdp-FULL_SHARD"] == costs["dp1xtp1"] == 1.0  # one rank, either family
    assert costs["dp2xtp1"] < costs["dp2xtp2"]
