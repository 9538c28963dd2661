"""The suites' pairwise cover: every pair of the declared space is taken by a row."""

from __future__ import annotations

from harness.conformance.coverage import pairs_of
from suites.lib.controller.covering import COVER_MODELS, candidates, cover_rows, universe
from suites.lib.controller.scenarios import valid_wrap
from suites.lib.shared.axes import scenario_axes
from suites.lib.shared.specs import FSDPConfig, MPConfig

WORLDS = (1, 2, 3, 4)


def test_the_rows_take_every_pair_of_the_space_and_are_far_fewer_than_the_candidates() -> None:
    rows = cover_rows(WORLDS)
    taken = set().union(*(pairs_of(row.axes()) for row in rows))
    assert taken == universe(WORLDS)
    assert len(rows) < len(candidates(WORLDS)) // 20
    assert {row.scenario.family for row in rows} == {"fsdp", "model_parallel"}
    assert {row.fmt for row in rows} == {"full", "sharded"}


def test_the_space_holds_every_value_the_suites_draw_on_the_main_axes() -> None:
    values: dict[str, set[str]] = {}
    for first, a, second, b in universe(WORLDS):
        values.setdefault(first, set()).add(a)
        values.setdefault(second, set()).add(b)
    assert values["world_size"] == {"1", "2", "3", "4"}
    assert values["precision"] == {"32-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true"}
    assert {"FULL_SHARD", "NO_SHARD", "HYBRID_SHARD", "dp+tp", "tp", "dp"} <= values["sharding"]
    assert {"none", "size", "callable", "fully_shard root only"} <= values["wrap"]
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
    }


def test_rows_are_valid_configurations_with_stable_distinct_ids() -> None:
    rows = cover_rows(WORLDS)
    assert len({row.id for row in rows}) == len(rows)
    assert [row.id for row in rows] == [row.id for row in cover_rows.__wrapped__(WORLDS)]
    for row in rows:
        s = row.scenario
        assert s.model in COVER_MODELS
        if isinstance(s.strategy, FSDPConfig):
            assert valid_wrap(s.model, s.strategy.wrap), row.id
            mesh = s.strategy.device_mesh
            assert mesh is None or mesh[0] * mesh[1] == s.world_size, row.id
        else:
            assert isinstance(s.strategy, MPConfig)
            tp = s.strategy.tensor_parallel_size
            assert s.strategy.data_parallel_size * tp == s.world_size, row.id
            assert all(b.ffn % tp == 0 and b.heads % tp == 0 for b in s.model.blocks), row.id
        if s.precision == "16-true":
            assert s.optim.kind == "sgd", row.id
        assert scenario_axes(s, row.fmt) == row.axes()


def test_a_smaller_world_gives_a_smaller_space_without_the_larger_sizes() -> None:
    small = universe((1, 2))
    assert small < universe(WORLDS)  # the same configurations, fewer world sizes
    assert not any(p[0] == "world_size" and p[1] in ("3", "4") for p in small)
    assert not any(p[2] == "world_size" and p[3] in ("3", "4") for p in small)
