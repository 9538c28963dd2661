"""CONTRACT.md MP-1, MP-2 and MP-4, with SHARD-1, TRAIN-1 and SYNC-1 (model_parallel family):
the 2-D mesh, tensor parallel + FSDP2 parity and layout, gradient-sync switching. MP-3
(checkpoints) lives in the checkpoint suites.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import example, given

from suites.lib.controller.clause_covers import covering_examples
from suites.lib.controller.dispatch import run
from suites.lib.controller.oracles import assert_parity
from suites.lib.controller.scenarios import meshes, scenarios, train_plans, world_sizes
from suites.lib.ranks.model_parallel_jobs import layout_rank, mesh_rank, switch_rank
from suites.lib.ranks.training import train_rank
from suites.lib.shared.models import BlockSpec, ModelSpec
from suites.lib.shared.parallelize import expected_tp_placements
from suites.lib.shared.specs import MPConfig, OptimSpec, Scenario, TrainPlan

#: the transformer-shaped zoo on a 2 x 2 mesh: hand attention split by heads over the
#: tensor-parallel dim, nn.MultiheadAttention left to FSDP2, a root parameter and a Block
#: called twice (its own unit); drawn scenarios reach it only by chance
ZOO_2X2 = Scenario(
    4,
    ModelSpec(
        hidden=6,
        blocks=(
            BlockSpec("AttentionBlock", ffn=2, heads=2, tokens=3),
            BlockSpec("AttentionBlock", ffn=2, attention="mha", heads=2, tokens=2),
        ),
        root_param=True,
        shared=True,
        shared_ffn=2,
        seed=5,
    ),
    MPConfig(2, 2, "mlp", fsdp_classes=("AttentionBlock", "Block")),
    OptimSpec("adamw", lr=0.01),
    TrainPlan(2),
)


@pytest.mark.clause("MP-1")
@given(world_sizes().flatmap(lambda w: meshes(w).map(lambda m: (w, m))))
def test_the_mesh_is_built_at_setup_environment_and_handed_over(case: tuple) -> None:
    world, (dp, tp) = case
    for rank, out in enumerate(run(mesh_rank, dp, tp, world_size=world)):
        assert out["early"] == "RuntimeError", (
            f"rank {rank}: reading device_mesh before setup_environment gave {out['early']}"
        )
        assert out["type"] == out["device"], f"rank {rank}: mesh on {out['type']}"
        assert out["names"] == ("data_parallel", "tensor_parallel"), f"rank {rank}: {out}"
        assert out["shape"] == (dp, tp), f"rank {rank}: mesh shape {out['shape']} != {(dp, tp)}"
        assert out["handed"], f"rank {rank}: parallelize_fn did not get the strategy's mesh"


@pytest.mark.clause("MP-2", "TRAIN-1")
@covering_examples("MP-2")
@given(
    scenarios(
        "model_parallel",
        precisions=("32-true", "bf16-mixed"),
        plan=train_plans(max_steps=2, max_micro=2),
    )
)
@example(ZOO_2X2)
def test_tensor_parallel_and_fsdp2_training_matches_the_plain_model(scenario: Scenario) -> None:
    results = run(train_rank, scenario, world_size=scenario.world_size)
    assert_parity(results, scenario)


@pytest.mark.clause("SHARD-1", "MP-2")
# the model_parallel rows of SHARD-1's one cover (test_sharding runs the fsdp and fsdp2 rows)
@covering_examples("SHARD-1", part=lambda scenario: scenario.family == "model_parallel")
@given(scenarios("model_parallel"))
@example(ZOO_2X2)
def test_fsdp2_and_tensor_parallel_placements(scenario: Scenario) -> None:
    config = scenario.strategy
    assert isinstance(config, MPConfig)
    dp, tp = config.data_parallel_size, config.tensor_parallel_size
    for rank, out in enumerate(run(layout_rank, scenario, world_size=scenario.world_size)):
        assert "" in out["units"], f"rank {rank}: the root is not an FSDP2 module: {out['units']}"
        dp_rank = rank // tp
        for name, (placements, local, full) in out["params"].items():
            where = f"rank {rank}: parameter {name!r} (placements {placements})"
            assert placements, f"{where} is not a DTensor"
            assert "Shard(dim=0" in placements[0], f"{where} is not split on dim 0 over dp"
            plan = expected_tp_placements(name) if config.tp_plan == "mlp" else None
            if plan is not None:
                assert placements[1:] == plan, f"{where}: the plan gives {plan}"
                continue
            assert len(placements) == 1, f"{where}: not tensor parallel, yet {placements}"
            rows = math.ceil(full[0] / dp)
            want = max(0, min(rows, full[0] - dp_rank * rows))
            assert local[0] == want, f"{where}: holds {local[0]} of {full[0]} rows, not {want}"


def _all_off(flags: dict[str, Any]) -> bool:
    return all(not any(any(pair) for pair in groups) for groups in flags.values())


@pytest.mark.clause("MP-4", "SYNC-1")
@covering_examples("MP-4")
@given(scenarios("model_parallel"))
def test_no_backward_sync_switches_every_fsdp2_module_and_restores_it(scenario: Scenario) -> None:
    for rank, out in enumerate(run(switch_rank, scenario, world_size=scenario.world_size)):
        before = out["before"]
        assert _all_off(out["inside"]), f"rank {rank}: sync still on inside: {out['inside']}"
        assert out["after"] == before, f"rank {rank}: after exit {out['after']}, was {before}"
        assert out["after_raise"] == before, (
            f"rank {rank}: after the body raised {out['after_raise']}, was {before}"
        )
        if "user_before" in out:
            assert out["user_after"] == out["user_before"], (
                f"rank {rank}: sync state before entering {out['user_before']} was not "
                f"restored exactly: {out['user_after']}"
            )
