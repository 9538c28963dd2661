"""CONTRACT.md SHARD-1, SHARD-2, WRAP-1, WRAP-2, AC-1 and AC-2: sharding layout,
consistency, wrap policies, activation checkpointing.

SHARD-1 is checked here for the fsdp family (FSDP1's flat parameters) and the fsdp2 family
(DTensor rows over the shard dimension), and in ``test_model_parallel.py`` for the
model_parallel family; the three checks share the clause's one value cover, each running its
family's rows. WRAP-1 speaks of FSDP1 units (the fsdp2 family's are FSDP2-1's, in
``test_fsdp2.py``); WRAP-2 runs a unit the user made under the fsdp family (an FSDP1 wrapper)
and the fsdp2 family (``fully_shard``); AC-1 and AC-2 run the two families that checkpoint by
their own policy. WRAP-1 and AC-1 (and FSDP2-1) also draw models that hold a subclass of a
listed class and another module's class of a listed class's name, and run such a model in
every profile (``suites/lib/controller/lookalikes.py``): "each instance of those classes".

Every test drives the strategy only through ``ctx.make_strategy`` (``--strategy``) and
reads the result with torch's own APIs (``suites/lib/ranks/readers.py``,
``suites/lib/ranks/structure.py``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from suites.lib.controller.clause_covers import covering_examples, covering_rows
from suites.lib.controller.covering import CoverRow, richest_block
from suites.lib.controller.dispatch import run
from suites.lib.controller.lookalikes import AC_LOOKALIKES, AC_NESTED, WRAP_LOOKALIKES
from suites.lib.controller.oracles import (
    assert_close_state,
    assert_parity,
    assert_same_on_ranks,
    reference_run,
)
from suites.lib.controller.regressions import AC_BLOCKS, WRAP_MHA_MIXED
from suites.lib.controller.scenarios import job_world, scenarios, train_plans
from suites.lib.controller.selection import selection_difference
from suites.lib.controller.tolerances import EXACT
from suites.lib.ranks.sharding_jobs import (
    ac_rank,
    dtensor_layout_rank,
    layout_rank,
    prechecked_rank,
    prewrapped_rank,
    units_rank,
)
from suites.lib.ranks.training import train_rank
from suites.lib.shared.models import BlockSpec, ModelSpec, build_model
from suites.lib.shared.specs import ACSpec, FSDP2Config, FSDPConfig, Scenario, WrapSpec

#: FSDP1 aligns every original parameter inside a flat parameter (16 bytes on CPU); this
#: bounds the padding it may add per parameter, in elements: up to 7 of a 2-byte dtype
#: (bf16-true, 16-true), 3 of a 4-byte one.
ALIGN_SLACK = 8

FAMILIES = st.sampled_from(["fsdp", "model_parallel", "fsdp2"])
#: the families that checkpoint activations by their own policy
SELF_SHARDING = st.sampled_from(["fsdp", "fsdp2"])


def _of(family: str) -> Callable[[Scenario], bool]:
    """The SHARD-1 check of ``family`` runs that family's rows of the clause's cover (and,
    with ``widest``, a row at the session's largest world size where the cover took that
    size from another family's row only)."""
    return lambda scenario: scenario.family == family


def _assert_initial_state(
    state: dict[str, Any], initial: dict[str, Any], scenario: Scenario, rank: int
) -> None:
    """SHARD-1: ``rank``'s gathered state is the plain model's eager init, bitwise; the
    persistent buffers are compared (and named) as buffers, the rest as parameters."""
    plain = build_model(scenario.model, "meta")
    buffers = {name for name, _ in plain.named_buffers(remove_duplicate=False)} & set(initial)
    parameters = set(initial) - buffers
    where = f"rank {rank}"
    assert_close_state(state, initial, EXACT, what=f"{where}: parameter", keys=parameters)
    assert_close_state(state, initial, EXACT, what=f"{where}: buffer", keys=buffers)


@pytest.mark.clause("SHARD-1")
@covering_examples("SHARD-1", part=_of("fsdp"), widest=True)
@given(scenarios("fsdp", wrap_kinds=("none", "classes", "size")))
def test_each_rank_holds_its_share_of_every_unit(scenario: Scenario) -> None:
    config = scenario.strategy
    assert isinstance(config, FSDPConfig)
    results = run(layout_rank, scenario, world_size=scenario.world_size)
    factor = scenario.shard_factor
    initial = reference_run(scenario, steps=0).initial
    for rank, result in enumerate(results):
        assert result["units"], f"rank {rank}: setup_module returned no FSDP unit"
        for name, unit in result["units"].items():
            if unit is None:
                continue
            want = math.ceil(unit.unsharded / factor)
            assert unit.local == want, (
                f"rank {rank}: FSDP unit {name or '<root>'!r} holds {unit.local} of "
                f"{unit.unsharded} flat-parameter elements; "
                f"{config.sharding_strategy} must hold ceil({unit.unsharded}/"
                f"{factor}) = {want}"
            )
            assert unit.unsharded - unit.params <= ALIGN_SLACK * unit.count, (
                f"rank {rank}: unit {name!r} pads {unit.params} elements to {unit.unsharded}"
            )
        # the union of the shards is the full model: torch's gather gives the eager init
        _assert_initial_state(result["state"], initial, scenario, rank)


@pytest.mark.clause("SHARD-1")
@covering_examples("SHARD-1", part=_of("fsdp2"), widest=True)
@given(scenarios("fsdp2"))
def test_each_rank_holds_its_rows_of_every_fsdp2_parameter(scenario: Scenario) -> None:
    config = scenario.strategy
    assert isinstance(config, FSDP2Config)
    shards = scenario.shard_factor
    want_placements = (
        ("Shard(dim=0)",) if config.device_mesh is None else ("Replicate()", "Shard(dim=0)")
    )
    initial = reference_run(scenario, steps=0).initial
    for rank, out in enumerate(run(dtensor_layout_rank, scenario, world_size=scenario.world_size)):
        shard = rank % shards  # the mesh is (replicate, shard), row-major over the ranks
        for name, (placements, local, full) in out["params"].items():
            where = f"rank {rank}: parameter {name!r} {full} (placements {placements})"
            assert placements == want_placements, (
                f"{where}: must be a DTensor with placements {want_placements}"
            )
            rows = math.ceil(full[0] / shards)
            want = max(0, min(rows, full[0] - shard * rows))
            assert local[0] == want and local[1:] == full[1:], (
                f"{where}: holds {local[0]} of {full[0]} rows; shard {shard} of {shards} must "
                f"hold {want}"
            )
        # the union of the shards is the full model: torch's gather gives the eager init
        _assert_initial_state(out["state"], initial, scenario, rank)


@pytest.mark.clause("SHARD-2")
@example(WRAP_MHA_MIXED)
@given(
    FAMILIES.flatmap(
        lambda family: scenarios(
            family, precisions=("32-true", "bf16-mixed"), plan=train_plans(max_steps=3)
        )
    )
)
def test_gathered_parameters_identical_on_every_rank(scenario: Scenario) -> None:
    results = run(train_rank, scenario, world_size=scenario.world_size)
    assert_same_on_ranks([r.state for r in results], what="gathered parameter")


@pytest.mark.clause("WRAP-1")
@covering_examples("WRAP-1")
@given(
    scenarios(
        "fsdp",
        wrap_kinds=("classes", "module_wrap_policy", "custom_policy", "size", "callable"),
        optimizers=("sgd",),
        nested=True,
        lookalikes=None,
    )
)
@example(WRAP_LOOKALIKES[0])
@example(WRAP_LOOKALIKES[1])
def test_units_are_exactly_those_the_policy_selects(scenario: Scenario) -> None:
    config = scenario.strategy
    assert isinstance(config, FSDPConfig)
    plain = build_model(scenario.model, "meta")
    expected = sorted(config.wrap.expected_units(plain) | {""})
    for rank, units in enumerate(run(units_rank, scenario, world_size=scenario.world_size)):
        assert units == expected, (
            f"rank {rank}: FSDP units differ from the ones {config.wrap} selects: "
            f"{selection_difference(plain, units, expected)}; units {units}, selected "
            f"{expected} ('' is the root)"
        )


def _small_scenario(world: int, **config: Any) -> Scenario:
    spec = ModelSpec(hidden=4, blocks=(BlockSpec(ffn=3), BlockSpec(ffn=2)), seed=1)
    return Scenario(world, spec, FSDPConfig(**config))


@pytest.mark.clause("WRAP-2")
def test_a_module_the_user_wrapped_is_kept_and_the_policy_ignored() -> None:
    _check_prewrapped(_small_scenario(job_world(), wrap=WrapSpec("classes", ("Block",))))


@pytest.mark.clause("WRAP-2")
@pytest.mark.parametrize("row", covering_rows("WRAP-2"), ids=lambda row: row.id)
def test_a_module_the_user_wrapped_is_kept_across_the_space(row: CoverRow) -> None:
    """Every family, wrap kind, world size and model of the clause's scope (``blocks.0``
    made a unit by the user: an FSDP1 wrapper, or ``fully_shard`` under the fsdp2 family)."""
    _check_prewrapped(row.scenario)


def _check_prewrapped(scenario: Scenario) -> None:
    config = scenario.strategy
    assert isinstance(config, (FSDPConfig, FSDP2Config))
    unit = "FSDP unit" if scenario.family == "fsdp" else "fully_shard unit (FSDPModule)"
    for rank, out in enumerate(run(prewrapped_rank, scenario, world_size=scenario.world_size)):
        assert out["units"] == ["", "blocks.0"], (
            f"rank {rank} ({scenario.family}, wrap {config.wrap.kind}): {unit}s "
            f"{out['units']}; the user's {unit} blocks.0 must be kept as it is, the root made "
            "one, and no other module ('' is the root): the auto-wrap policy must be ignored"
        )
        assert config.wrap.kind == "none" or any(  # no policy: nothing to ignore
            "wrap" in w.lower() for w in out["warnings"]
        ), f"rank {rank}: no warning that the auto-wrap policy is ignored; got {out['warnings']}"


def _with_checkpointing(scenario: Scenario) -> Scenario:
    """``scenario`` with its model's richest block class checkpointed (covering examples)."""
    assert isinstance(scenario.strategy, (FSDPConfig, FSDP2Config))
    ac = ACSpec("classes", richest_block(scenario.model))
    return dataclasses.replace(scenario, strategy=dataclasses.replace(scenario.strategy, ac=ac))


@pytest.mark.clause("AC-1")
@covering_examples("AC-1", adapt=_with_checkpointing)
@given(
    SELF_SHARDING.flatmap(
        lambda f: scenarios(
            f, ac=True, optimizers=("sgd",), wrap_kinds=("none", "classes"), lookalikes=None
        )
    )
)
@example(AC_BLOCKS)
@example(AC_LOOKALIKES[0])
@example(AC_LOOKALIKES[1])
@example(AC_NESTED)
def test_checkpointing_wraps_exactly_the_selected_modules(scenario: Scenario) -> None:
    config = scenario.strategy
    assert isinstance(config, (FSDPConfig, FSDP2Config))
    plain = build_model(scenario.model, "meta")
    expected = sorted(config.ac.expected_wrapped(plain))
    for rank, out in enumerate(run(ac_rank, scenario, world_size=scenario.world_size)):
        assert not out["nested"], f"rank {rank}: checkpoint wrappers nested: {out['nested']}"
        assert out["wrapped"] == expected, (
            f"rank {rank}: checkpoint-wrapped modules differ from the ones {config.ac} "
            f"selects: {selection_difference(plain, out['wrapped'], expected)}; wrapped "
            f"{out['wrapped']}, selected {expected}"
        )


@pytest.mark.clause("AC-1")
@pytest.mark.parametrize("family", ["fsdp", "fsdp2"])
def test_checkpointing_leaves_an_already_checkpointed_model_alone(family: str) -> None:
    ac = ACSpec("classes", ("Block",))
    config = FSDPConfig(ac=ac) if family == "fsdp" else FSDP2Config(ac=ac)
    scenario = dataclasses.replace(_small_scenario(job_world()), strategy=config)
    for rank, out in enumerate(run(prechecked_rank, scenario, world_size=scenario.world_size)):
        assert out["wrapped"] == ["blocks.0"] and not out["nested"], (
            f"rank {rank}: checkpoint wrappers {out['wrapped']} (nested: {out['nested']}); "
            "only the user's blocks.0 wrapper may exist"
        )
        assert any("checkpoint" in w.lower() for w in out["warnings"]), (
            f"rank {rank}: no warning that checkpointing was already applied; got {out['warnings']}"
        )


@pytest.mark.clause("AC-2")
@covering_examples("AC-2", adapt=_with_checkpointing)
@given(
    SELF_SHARDING.flatmap(
        lambda f: scenarios(f, ac=True, wrap_kinds=("none", "classes"), plan=train_plans())
    )
)
@example(AC_BLOCKS)
def test_checkpointing_changes_no_numbers(scenario: Scenario) -> None:
    # Gradients are compared where the ranks can read them as the plain model has them: under
    # 16-mixed they are still multiplied by the grad scaler's scale after backward, and under
    # the *-true precisions FSDP1's summon_full_params(with_grads=True) fails in torch ("assign
    # a gradient with dtype 'float' to a tensor with grad_dtype 'Half'"). Losses and the
    # parameters after the steps are compared under every precision.
    grads = scenario.precision in ("32-true", "bf16-mixed")
    results = run(train_rank, scenario, grads, world_size=scenario.world_size)
    assert_parity(results, scenario, grads=grads)
