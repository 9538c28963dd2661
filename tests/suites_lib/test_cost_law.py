"""The cost clauses' laws (suites/lib/controller/cost.py) on hand-made records: each bound is
the plain model's bytes and the configuration's promise, not a figure of the reference."""

from __future__ import annotations

import pytest

from suites.lib.controller.cost import law_of, where
from suites.lib.shared.cost_record import CostRecord
from suites.lib.shared.models import BlockSpec, ModelSpec, build_model
from suites.lib.shared.specs import FSDP2Config, FSDPConfig, MPConfig, Scenario, TrainPlan, WrapSpec

MODEL = ModelSpec(hidden=8, blocks=(BlockSpec(ffn=16),) * 4, in_features=8, out=4, scale=False)
BLOCKS = WrapSpec("classes", classes=("Block",))


def _plain_bytes() -> int:
    return sum(p.numel() * 4 for p in build_model(MODEL, "meta").parameters())


def _record() -> CostRecord:
    params = _plain_bytes()
    plain = {"params": params, "grads": params, "optimizer": 2 * params, "activations": 100}
    return CostRecord(rank=0, plain=plain)


def _scenario(world: int, config: object, micro: int = 1) -> Scenario:
    plan = TrainPlan(micro_batches=micro)
    return Scenario(world_size=world, model=MODEL, strategy=config, plan=plan)  # type: ignore[arg-type]


def test_the_share_is_the_plain_model_over_the_shard_size_with_padding() -> None:
    law = law_of(_scenario(4, FSDPConfig("FULL_SHARD", wrap=BLOCKS)), _record())
    params = _plain_bytes()
    assert law.shard == 4
    assert params // 4 < law.share("params") < params // 2
    # Adam's two moments: twice the parameters' share, padding for each copy
    assert law.share("optimizer") > 2 * (params // 4)
    unsharded = law_of(_scenario(4, FSDPConfig("NO_SHARD", wrap=BLOCKS)), _record())
    assert unsharded.shard == 1 and unsharded.share("params") >= params


def test_units_in_flight_follow_reshard_after_forward() -> None:
    record = _record()
    full = law_of(_scenario(4, FSDPConfig("FULL_SHARD", wrap=BLOCKS)), record)
    zero2 = law_of(_scenario(4, FSDPConfig("SHARD_GRAD_OP", wrap=BLOCKS)), record)
    to_two = law_of(_scenario(4, FSDP2Config(wrap=BLOCKS, reshard_after_forward=2)), record)
    assert len(full.units) == 5  # the root and four blocks
    assert full.in_flight_params() < to_two.in_flight_params() < zero2.in_flight_params()
    assert zero2.in_flight_params() == record.plain["params"]
    assert full.peak_bound() < zero2.peak_bound()
    # gradients: two units, or every unit while micro-batches accumulate
    accumulating = law_of(_scenario(4, FSDPConfig("FULL_SHARD", wrap=BLOCKS), micro=2), record)
    assert full.in_flight_grads() < accumulating.in_flight_grads() == record.plain["grads"]


def test_the_gather_floor_holds_only_where_units_reshard() -> None:
    record = _record()
    full = law_of(_scenario(4, FSDPConfig("FULL_SHARD", wrap=BLOCKS)), record)
    assert full.gather_floor() == 2 * record.plain["params"] - full.units[""]
    assert (
        law_of(_scenario(4, FSDPConfig("SHARD_GRAD_OP", wrap=BLOCKS)), record).gather_floor() == 0
    )
    assert law_of(_scenario(1, FSDP2Config(wrap=BLOCKS)), record).gather_floor() == 0
    mixed = law_of(_scenario(4, FSDP2Config(wrap=BLOCKS, precision="bf16-mixed")), record)
    assert mixed.gather_floor() == full.gather_floor() // 2


def test_a_full_save_lets_rank_0_hold_the_whole_state_once() -> None:
    law = law_of(_scenario(4, FSDP2Config(wrap=BLOCKS)), _record())
    whole = law.params + law.optimizer
    assert law.save_bound(0) - law.save_bound(1) == pytest.approx(1.05 * whole, abs=2)


@pytest.mark.parametrize(
    ("config", "words"),
    [
        (FSDPConfig("HYBRID_SHARD", wrap=BLOCKS, device_mesh=(2, 2)), "fsdp (HYBRID_SHARD, mesh"),
        (
            FSDP2Config(wrap=BLOCKS, reshard_after_forward=False),
            "fsdp2 (reshard_after_forward=False",
        ),
        (MPConfig(data_parallel_size=2, tensor_parallel_size=2), "model_parallel (dp 2 x tp 2"),
    ],
)
def test_a_configuration_is_named_in_one_piece(config: object, words: str) -> None:
    named = where(_scenario(4, config))
    assert named.startswith(words) and named.endswith("at world size 4")
    # no top-level comma: the headline keeps it as one place, and findings group across them
    depth = 0
    for char in named:
        depth += char == "("
        depth -= char == ")"
        assert not (char == "," and depth == 0), named
