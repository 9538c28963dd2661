"""CONTRACT.md CFG-1..CFG-6: the fsdp family's options (CFG-3 and CFG-4 the fsdp2 family's too:
their jobs run each of the two families the strategy builds, and report which; CFG-6 is
parametrized with each family it applies to).

Bad input must get a clear error: the tests check the exception type and, with
``pytest.raises(..., match=...)`` on the ranks, the key words of the message (the value and
the option). Accepted input must be honoured: the tests read what torch built (FSDP units,
their process groups and meshes, checkpoint wrappers). Each test runs one job; Hypothesis
draws several values per example so that one job checks many. CFG-7..CFG-10 are in
``test_config_general.py``.
"""

from __future__ import annotations

import string
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from harness import run_on_ranks
from harness.clauses import CLAUSES
from suites.lib.controller.cuda_env import has_accelerator
from suites.lib.controller.dispatch import report, run
from suites.lib.controller.oracles import assert_parity
from suites.lib.controller.scenarios import SHARDING_STRATEGIES, job_world, world_sizes
from suites.lib.ranks.config_jobs import (
    SELF_SHARDING,
    device_mesh_rank,
    hybrid_rank,
    offload_forms,
    offload_rank,
    orig_params_rank,
    policy_rank,
    sharding_rank,
)
from suites.lib.ranks.construction import (
    SPEC,
)
from suites.lib.shared.models import build_model
from suites.lib.shared.specs import ACSpec, FSDPConfig, OptimSpec, Scenario, TrainPlan, WrapSpec

NEAR_MISS_SHARDING = ("FULL-SHARD", "FULLSHARD", " FULL_SHARD", "HYBRID_SHARD_ZERO2", "SHARD", "")


# --- CFG-1 ------------------------------------------------------------------------------


@st.composite
def any_case(draw: st.DrawFn) -> str:
    """A sharding strategy name with each letter in a drawn case."""
    name = draw(st.sampled_from(SHARDING_STRATEGIES))
    flips = draw(st.lists(st.booleans(), min_size=len(name), max_size=len(name)))
    return "".join(c.swapcase() if flip else c for c, flip in zip(name, flips, strict=True))


BAD_SHARDING = st.one_of(
    st.sampled_from(NEAR_MISS_SHARDING),
    st.text(string.ascii_letters + string.digits + "_-", max_size=14).filter(
        lambda s: s.upper() not in SHARDING_STRATEGIES
    ),
    st.integers(-2, 9),
)


@pytest.mark.clause("CFG-1")
@given(names=st.lists(any_case(), min_size=1, max_size=4), bad=st.lists(BAD_SHARDING, max_size=4))
@example(names=list(SHARDING_STRATEGIES), bad=list(NEAR_MISS_SHARDING))
def test_sharding_strategy_names_in_any_case(names: list[str], bad: list[Any]) -> None:
    sharding = run(sharding_rank, names, bad, world_size=job_world(minimum=2), families=("fsdp",))
    for rank, seen in enumerate(sharding):
        for name, wanted, units in seen:
            assert units == [wanted], f"rank {rank}: sharding_strategy={name} built units {units}"


# --- CFG-2 ------------------------------------------------------------------------------


@pytest.mark.clause("CFG-2")
def test_hybrid_sharding_needs_a_way_to_form_groups() -> None:
    for rank, seen in enumerate(run_on_ranks(hybrid_rank, world_size=job_world(minimum=2))):
        for name, units in seen.items():
            assert units == [name], f"rank {rank}: {name} with an auto_wrap_policy built {units}"


# --- CFG-3 ------------------------------------------------------------------------------


MESH_SIDE = st.integers(1, 8)


@pytest.mark.clause("CFG-3")
@given(
    world=world_sizes(),
    name=st.sampled_from(("HYBRID_SHARD", "_HYBRID_SHARD_ZERO2")),
    shapes=st.lists(st.tuples(MESH_SIDE, MESH_SIDE), min_size=1, max_size=3),
    as_object=st.booleans(),
)
@example(world=2, name="HYBRID_SHARD", shapes=[(1, 2), (2, 1), (2, 2)], as_object=False)
@example(world=2, name="HYBRID_SHARD", shapes=[(1, 2)], as_object=True)
def test_device_mesh_tuple_or_mesh(
    world: int, name: str, shapes: list[tuple[int, int]], as_object: bool
) -> None:
    results = _families_reached(
        run(device_mesh_rank, name, shapes, as_object, world_size=world, families=SELF_SHARDING)
    )
    for rank, by_family in enumerate(results):
        for family, seen in by_family.items():
            for shape, (kind, detail, device) in zip(shapes, seen, strict=True):
                what = f"rank {rank} ({family}): device_mesh={shape} (as a DeviceMesh: {as_object})"
                replicate, shard = shape
                if replicate * shard != world:
                    assert kind == "refused", f"{what} at world size {world}: {detail}"
                    continue
                expected = _mesh_layouts(family, name, shape, world, device)
                assert detail in expected, (
                    f"{what} built {_MESH_LAYOUT[family]} {detail}; expected "
                    f"{' or '.join(map(str, expected))}"
                )


#: what :func:`~suites.lib.ranks.config_jobs.device_mesh_rank` reads of a built model
_MESH_LAYOUT = {
    "fsdp": "units with (strategy, shard group size, replicate group size, mesh device type)",
    "fsdp2": "parameters with (mesh shape, mesh device type, placements)",
}


def _mesh_layouts(
    family: str, name: str, shape: tuple[int, int], world: int, device: str
) -> list[list[tuple[Any, ...]]]:
    """The layouts a ``(replicate, shard)`` mesh may give ``family``'s model (CFG-3)."""
    replicate, shard = shape
    expected: list[list[tuple[Any, ...]]]
    if family == "fsdp2":  # HSDP: every parameter sharded over shard, replicated over replicate
        expected = [[((replicate, shard), device, ("Replicate()", "Shard(dim=0)"))]]
        if replicate == 1:  # one replica: plain sharding over a 1-D mesh is that too
            expected.append([((shard,), device, ("Shard(dim=0)",))])
        return expected
    expected = [[(name, shard, replicate, device)]]
    if shard == 1:  # plain replication: NO_SHARD over the world is that too
        expected.append([("NO_SHARD", world, None, None)])
    return expected


def _families_reached(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``results`` (per rank, by family), after reporting the families rank 0 ran for the
    clause's coverage (the job runs each family the strategy builds: the dispatch sees no
    scenario and reports none)."""
    for family in results[0]:
        report({"family": (family,)})
    return results


# --- CFG-4 ------------------------------------------------------------------------------


@pytest.mark.clause("CFG-4")
def test_policies_in_every_accepted_form() -> None:
    plain = build_model(SPEC, "meta")
    units = sorted(WrapSpec("classes", ("Block",)).expected_units(plain) | {""})
    checkpointed = sorted(ACSpec("classes", ("Block",)).expected_wrapped(plain))
    results = _families_reached(run_on_ranks(policy_rank, world_size=job_world()))
    for rank, by_family in enumerate(results):
        for family, seen in by_family.items():
            for key, value in seen.items():
                expected = units if key.startswith("wrap") else checkpointed
                what = "units" if key.startswith("wrap") else "checkpointed modules"
                assert value == expected, (
                    f"rank {rank} ({family}): {key} selected the {what} {value}; every Block "
                    f"(and only Blocks{', and the root' if what == 'units' else ''}) should "
                    f"be: {expected}"
                )


# --- CFG-5 ------------------------------------------------------------------------------


@pytest.mark.clause("CFG-5")
def test_use_orig_params() -> None:
    scenario = Scenario(
        job_world(),
        SPEC,
        FSDPConfig(extra=(("use_orig_params", False),)),
        OptimSpec("sgd", lr=0.1),
        TrainPlan(steps=1, batch_size=2),
    )
    results = run_on_ranks(orig_params_rank, scenario, world_size=scenario.world_size)
    for rank, seen in enumerate(results):
        assert seen["default"] == [True] and not seen["names"], (
            f"rank {rank}: by default FSDP units must use use_orig_params=True; got "
            f"{seen['default']}, flat parameters {seen['names']}"
        )
    assert_parity([seen["result"] for seen in results], scenario)


# --- CFG-6 ------------------------------------------------------------------------------


@pytest.mark.clause("CFG-6")
@pytest.mark.parametrize("family", CLAUSES["CFG-6"].families)
def test_cpu_offload_of_parameters_without_an_accelerator_is_refused(family: str) -> None:
    if has_accelerator():
        pytest.skip("environment: CFG-6's refusal applies to machines without an accelerator")
    seen_by_rank = run(offload_rank, family, world_size=job_world(), families=(family,))
    for rank, seen in enumerate(seen_by_rank):
        for label, _, offloads in offload_forms(family):
            what = f"rank {rank} ({family}): cpu_offload={label}"
            if not offloads:
                assert seen[label] == ("ok", ""), f"{what}: {seen[label]}"
                continue
            kind, message = seen[label]
            assert kind in ("ValueError", "unsupported") and "cpu_offload" in message, (
                f"{what} on a machine without an accelerator must raise ValueError (or be "
                f"declared Unsupported) naming cpu_offload; got {kind}: {message or 'no error'}"
            )
