"""CONTRACT.md section 7 (FSDP2-1 .. FSDP2-4): what the fsdp2 family adds.

- FSDP2-1: the ``FSDPModule`` s are exactly the wrap policy's modules and the root, every
  parameter a DTensor sharded on dim 0;
- FSDP2-2: after a forward the parameters are sharded, unsharded or resharded to the int
  ``reshard_after_forward`` asks for, and training matches the plain model; an int that does
  not divide the shard dimension is refused;
- FSDP2-3: HSDP on a ``(replicate, shard)`` mesh trains like the plain model, and its
  checkpoints load at another world size and mesh;
- FSDP2-4: the precision's mixed-precision policy: the dtypes parameters are gathered in for
  forward, gradients reduced in, the output has, and the stored ones.

Every other clause runs the fsdp2 family beside the others (the family lists of each suite and
the configuration cover).
"""

from __future__ import annotations

import dataclasses
import math
import tempfile

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from harness.verdicts.checked_file import loading_checked_file
from suites.lib.controller.checkpoint_checks import assert_loaded_equals_saved
from suites.lib.controller.checkpoint_plans import ckpt_plans
from suites.lib.controller.clause_covers import covering_examples
from suites.lib.controller.dispatch import run
from suites.lib.controller.lookalikes import FSDP2_LOOKALIKES
from suites.lib.controller.oracles import assert_parity, expected_dtypes
from suites.lib.controller.scenarios import (
    examples,
    fsdp2_configs,
    job_world,
    max_world_size,
    model_specs,
    scenarios,
    train_plans,
    world_sizes,
)
from suites.lib.controller.selection import selection_difference
from suites.lib.controller.written import check_written
from suites.lib.ranks.checkpoint_jobs import load_rank, path_for, save_rank
from suites.lib.ranks.fsdp2_jobs import (
    after_forward_rank,
    policy_dtypes_rank,
    reshard_size_rank,
    units_rank,
)
from suites.lib.ranks.training import train_rank
from suites.lib.shared.models import ModelSpec, build_model
from suites.lib.shared.specs import FSDP2Config, Scenario, TrainPlan

PRECISIONS = ("32-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true")


def _config(scenario: Scenario) -> FSDP2Config:
    config = scenario.strategy
    assert isinstance(config, FSDP2Config), f"not an fsdp2 scenario: {scenario}"
    return config


@pytest.mark.clause("FSDP2-1")
@covering_examples("FSDP2-1")
@given(scenarios("fsdp2", nested=True, optimizers=("sgd",), lookalikes=None))
@example(FSDP2_LOOKALIKES[0])
@example(FSDP2_LOOKALIKES[1])
def test_units_are_the_policys_modules_and_the_root(scenario: Scenario) -> None:
    config = _config(scenario)
    plain = build_model(scenario.model, "meta")
    expected = sorted(config.wrap.expected_units(plain) | {""})
    for rank, out in enumerate(run(units_rank, scenario, world_size=scenario.world_size)):
        assert out["units"] == expected, (
            f"FSDP2-1: rank {rank}: FSDPModules differ from the ones {config.wrap} selects "
            f"plus the root: {selection_difference(plain, out['units'], expected)}; units "
            f"{out['units']}, selected {expected} ('' is the root)"
        )
        unsharded = {n: p for n, p in out["placements"].items() if "Shard(dim=0)" not in p}
        assert not unsharded, (
            f"FSDP2-1: rank {rank}: parameters not sharded on dim 0 over the mesh: {unsharded}"
        )


def _reshard_over(scenario: Scenario) -> int | None:
    """Over how many ranks a parameter is split after a forward (None: unsharded)."""
    raf = _config(scenario).reshard_after_forward
    if raf is False:
        return None
    return scenario.shard_factor if raf is True else int(raf)


@pytest.mark.clause("FSDP2-2")
@covering_examples("FSDP2-2")
@given(scenarios("fsdp2", plan=train_plans(max_steps=2)))
def test_reshard_after_forward_layout_and_parity(scenario: Scenario) -> None:
    plain = dict(build_model(scenario.model, "meta").named_parameters())
    over = _reshard_over(scenario)
    outs = run(after_forward_rank, scenario, world_size=scenario.world_size)
    raf = _config(scenario).reshard_after_forward
    for name, param in plain.items():
        shape = tuple(param.shape)
        seen = [out[name] for out in outs]
        where = f"FSDP2-2: reshard_after_forward={raf!r}: {name} {shape} after a forward"
        if over is None:
            assert all(s == ("tensor", shape) for s in seen), f"{where}: {seen}; unsharded"
            continue
        rows = math.ceil(shape[0] / over)
        assert all(kind == "dtensor" and local[1:] == shape[1:] for kind, local in seen), (
            f"{where}: {seen}; expected DTensor shards"
        )
        local_rows = [local[0] for _, local in seen]
        assert max(local_rows) == rows and all(r <= rows for r in local_rows), (
            f"{where}: local rows {local_rows} on the ranks; resharded over {over} ranks gives "
            f"at most {rows} rows a rank, that many on some rank"
        )
    assert_parity(run(train_rank, scenario, world_size=scenario.world_size), scenario)


@pytest.mark.clause("FSDP2-2")
def test_an_int_that_does_not_divide_the_shard_dim_is_refused() -> None:
    world = 4 if max_world_size() >= 4 else job_world(3, minimum=3)
    raf = 3 if world == 4 else 2
    model = ModelSpec(hidden=4, blocks=(), seed=2)
    scenario = Scenario(world, model, FSDP2Config(reshard_after_forward=raf), plan=TrainPlan())
    for rank, out in enumerate(run(reshard_size_rank, scenario, world_size=world)):
        assert out.startswith("ValueError") and str(raf) in out, (
            f"FSDP2-2: rank {rank}: reshard_after_forward={raf} at world size {world} gave "
            f"{out!r}; expected ValueError naming {raf}"
        )


@st.composite
def hsdp_scenarios(draw: st.DrawFn) -> Scenario:
    """An fsdp2 scenario on a ``(replicate, shard)`` mesh with at least two replicas."""
    world = draw(world_sizes(min_size=2))
    spec = draw(model_specs())
    precision = draw(st.sampled_from(("32-true", "bf16-mixed")))
    config = draw(fsdp2_configs(world, spec, precisions=(precision,), hsdp=True))
    plan = draw(train_plans(max_steps=2, max_micro=2))
    return Scenario(world, spec, config, plan=plan)


@pytest.mark.clause("FSDP2-3")
@covering_examples("FSDP2-3")
@given(hsdp_scenarios())
def test_hsdp_trains_like_the_plain_model(scenario: Scenario) -> None:
    assert_parity(run(train_rank, scenario, world_size=scenario.world_size), scenario)


@pytest.mark.clause("FSDP2-3")
@pytest.mark.parametrize("fmt", ["sharded", "full"])
@pytest.mark.world_size(4, 2)
@examples(1)
@given(data=st.data())
def test_hsdp_checkpoints_load_at_another_mesh(
    fmt: str, data: st.DataObject, tmp_path_factory: pytest.TempPathFactory
) -> None:
    if max_world_size() < 4:
        pytest.skip("environment: needs world size 4 for a (2, 2) mesh")
    plan = data.draw(ckpt_plans("fsdp2", fmt, (4, 2)), label="plan")
    save_config = dataclasses.replace(_config(plan.save), device_mesh=(2, 2))
    load_config = dataclasses.replace(_config(plan.load), device_mesh=None)
    plan = dataclasses.replace(
        plan,
        save=dataclasses.replace(plan.save, strategy=save_config),
        load=dataclasses.replace(plan.load, strategy=load_config),
    )
    path = path_for(tempfile.mkdtemp(dir=tmp_path_factory.getbasetemp()), fmt)
    saved = run(save_rank, plan, path, world_size=4)
    found = check_written(plan.save, fmt, path, where=plan.saved_at)  # before the other mesh
    with loading_checked_file(found):
        loaded = run(load_rank, plan, path, world_size=2)
    assert_loaded_equals_saved(plan, saved, loaded, clause="FSDP2-3")


@pytest.mark.clause("FSDP2-4")
@covering_examples("FSDP2-4")
@given(
    st.sampled_from(PRECISIONS).flatmap(
        lambda precision: scenarios(
            "fsdp2",
            precisions=(precision,),
            optimizers=("sgd",) if precision == "16-true" else ("adam", "sgd"),
        )
    )
)
def test_the_mixed_precision_policy(scenario: Scenario) -> None:
    want = {k: str(v) for k, v in expected_dtypes(scenario.precision).items()}
    compute, stored = want["compute"], want["stored"]
    for rank, out in enumerate(run(policy_dtypes_rank, scenario, world_size=scenario.world_size)):
        where = f"FSDP2-4: rank {rank} ({scenario.precision})"
        assert out["forward"] == [compute], (
            f"{where}: Linear weights reached forward as {out['forward']}; expected {compute}"
        )
        assert out["reduce"] in ([], [compute]), (
            f"{where}: gradients are reduced in {out['reduce']}; expected {compute}"
        )
        assert out["output"] == compute, f"{where}: the model's output is {out['output']}"
        assert out["grads"] in ([], [stored]), f"{where}: sharded gradients {out['grads']}"
        assert out["params"] == [stored], f"{where}: sharded parameters {out['params']}"
