"""CONTRACT.md CFG-1..CFG-6: the fsdp family's options.

Bad input must get a clear error: the tests check the exception type and, with
``pytest.raises(..., match=...)`` on the ranks, the key words of the message (the value and
the option). Accepted input must be honoured: the tests read what torch built (FSDP units,
their process groups and meshes, checkpoint wrappers). Each test runs one job; Hypothesis
draws several values per example so that one job checks many. CFG-7..CFG-10 are in
``test_config_general.py``.
"""

from __future__ import annotations

import string
import warnings
from typing import Any

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from harness import Unsupported, run_on_ranks
from suites.lib.controller.cuda_env import has_accelerator
from suites.lib.controller.oracles import assert_parity
from suites.lib.controller.scenarios import SHARDING_STRATEGIES, job_world, world_sizes
from suites.lib.ranks.construction import (
    SPEC,
    all_of,
    build,
    expect_error,
    fsdp_units,
    named,
    number,
    outcome,
    supported_families,
    unit_groups,
)
from suites.lib.ranks.readers import gathered_state
from suites.lib.ranks.training import RankResult, Trained, train
from suites.lib.shared.models import Block, build_model
from suites.lib.shared.specs import ACSpec, FSDPConfig, OptimSpec, Scenario, TrainPlan, WrapSpec

PUBLIC_SHARDING = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD")
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


def _sharding_rank(ctx: Any, names: list[Any], bad: list[Any]) -> list[tuple[str, str, list[str]]]:
    from torch.distributed.fsdp import ShardingStrategy

    supported_families(ctx, ("fsdp",))
    honoured = []
    for name in [*names, *ShardingStrategy]:
        wanted = name.name if isinstance(name, ShardingStrategy) else name.upper()
        mesh = (1, ctx.world_size) if "HYBRID" in wanted else None
        try:
            strategy = build(ctx, "fsdp", sharding_strategy=name, device_mesh=mesh)
        except Unsupported:  # accepted, but not runnable by this strategy (e.g. hybrid)
            honoured.append((repr(name), wanted, [wanted]))
            continue
        model = strategy.setup_module(build_model(SPEC))
        units = sorted({u.sharding_strategy.name for u in fsdp_units(model)})
        honoured.append((repr(name), wanted, units))
    for value in bad:
        expect_error(
            ValueError,
            all_of(named(value), *PUBLIC_SHARDING),
            f"sharding_strategy={value!r}",
            lambda value=value: build(ctx, "fsdp", sharding_strategy=value),
        )
    return honoured


@pytest.mark.clause("CFG-1")
@given(names=st.lists(any_case(), min_size=1, max_size=4), bad=st.lists(BAD_SHARDING, max_size=4))
@example(names=list(SHARDING_STRATEGIES), bad=list(NEAR_MISS_SHARDING))
def test_sharding_strategy_names_in_any_case(names: list[str], bad: list[Any]) -> None:
    for rank, seen in enumerate(
        run_on_ranks(_sharding_rank, names, bad, world_size=job_world(minimum=2))
    ):
        for name, wanted, units in seen:
            assert units == [wanted], f"rank {rank}: sharding_strategy={name} built units {units}"


# --- CFG-2 ------------------------------------------------------------------------------


def _hybrid_rank(ctx: Any) -> dict[str, Any]:
    import torch.distributed as dist

    supported_families(ctx, ("fsdp",))

    def setup(**options: Any) -> None:
        build(ctx, "fsdp", **options).setup_module(build_model(SPEC))

    out = {}
    for name in ("HYBRID_SHARD", "_HYBRID_SHARD_ZERO2"):
        both = {"device_mesh": (1, ctx.world_size), "extra": {"process_group": dist.group.WORLD}}
        expect_error(
            RuntimeError,
            all_of("hybrid", ignore_case=True),
            f"{name} without auto_wrap_policy, process_group or device_mesh",
            lambda name=name: setup(sharding_strategy=name),
            allow_unsupported=True,
        )
        expect_error(
            ValueError,
            all_of("process_group", "device_mesh"),
            f"{name} with both process_group and device_mesh",
            lambda name=name, both=both: setup(sharding_strategy=name, **both),
            allow_unsupported=True,
        )
        strategy = build(ctx, "fsdp", sharding_strategy=name, auto_wrap_policy={Block})
        model = strategy.setup_module(build_model(SPEC))
        out[name] = sorted({u.sharding_strategy.name for u in fsdp_units(model)})
    return out


@pytest.mark.clause("CFG-2")
def test_hybrid_sharding_needs_a_way_to_form_groups() -> None:
    for rank, seen in enumerate(run_on_ranks(_hybrid_rank, world_size=job_world(minimum=2))):
        for name, units in seen.items():
            assert units == [name], f"rank {rank}: {name} with an auto_wrap_policy built {units}"


# --- CFG-3 ------------------------------------------------------------------------------


def _mesh_rank(
    ctx: Any, name: str, shapes: list[tuple[int, int]], as_object: bool
) -> list[tuple[Any, ...]]:
    from torch.distributed.device_mesh import init_device_mesh

    supported_families(ctx, ("fsdp",))
    out: list[tuple[Any, ...]] = []
    world = ctx.world_size
    for replicate, shard in shapes:
        if replicate * shard != world:
            shape = (replicate, shard)
            message = expect_error(
                ValueError,
                all_of(number(replicate), number(shard), number(world)),
                f"device_mesh={shape} at world size {world}",
                lambda shape=shape: build(ctx, "fsdp", sharding_strategy=name, device_mesh=shape),
                allow_unsupported=True,
            )
            out.append(("refused", message, ctx.device.type))
            continue
        mesh: Any = (replicate, shard)
        if as_object:
            mesh = init_device_mesh(ctx.device.type, mesh, mesh_dim_names=("replicate", "shard"))
        strategy = build(ctx, "fsdp", sharding_strategy=name, device_mesh=mesh)
        model = strategy.setup_module(build_model(SPEC))
        out.append(("built", sorted({unit_groups(u) for u in fsdp_units(model)}), ctx.device.type))
    return out


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
    results = run_on_ranks(_mesh_rank, name, shapes, as_object, world_size=world)
    for rank, seen in enumerate(results):
        for (replicate, shard), (kind, detail, device) in zip(shapes, seen, strict=True):
            if replicate * shard != world:
                assert kind == "refused", f"rank {rank}: {(replicate, shard)} {detail}"
                continue
            expected = [[(name, shard, replicate, device)]]
            if shard == 1:  # plain replication: NO_SHARD over the world is that too
                expected.append([("NO_SHARD", world, None, None)])
            assert detail in expected, (
                f"rank {rank}: device_mesh={(replicate, shard)} (as a DeviceMesh: {as_object}) "
                f"built units with (strategy, shard group size, replicate group size, mesh "
                f"device type) {detail}; expected {' or '.join(map(str, expected))}"
            )


# --- CFG-4 ------------------------------------------------------------------------------


def _policies() -> dict[str, Any]:
    """Every accepted form of a policy that selects the zoo's Blocks, by name."""
    from torch.distributed.fsdp.wrap import CustomPolicy, ModuleWrapPolicy

    from suites.lib.shared.specs import select_by_class

    return {
        "set": {Block},
        "ModuleWrapPolicy": ModuleWrapPolicy({Block}),
        "CustomPolicy": CustomPolicy(lambda module: isinstance(module, Block)),
        "callable": lambda module, recurse, nonwrapped_numel: select_by_class(
            module, recurse, nonwrapped_numel, classes=("Block",)
        ),
    }


def _policy_rank(ctx: Any) -> dict[str, Any]:
    from suites.lib.ranks.structure import checkpoint_wrapped, fsdp1_units

    out: dict[str, Any] = {}
    for form, policy in _policies().items():
        model = build(ctx, "fsdp", auto_wrap_policy=policy).setup_module(build_model(SPEC))
        out[f"wrap {form}"] = sorted(fsdp1_units(model))
        strategy = build(ctx, "fsdp", activation_checkpointing_policy=policy)
        out[f"checkpoint {form}"] = checkpoint_wrapped(strategy.setup_module(build_model(SPEC)))
    for form, legacy in (("class", Block), ("list", [Block])):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            strategy = build(ctx, "fsdp", extra={"activation_checkpointing": legacy})
        deprecations = [
            str(w.message)
            for w in caught
            if issubclass(w.category, (DeprecationWarning, FutureWarning))
            or "deprecat" in str(w.message).lower()
        ]
        assert deprecations, f"activation_checkpointing={legacy} gave no deprecation warning"
        model = strategy.setup_module(build_model(SPEC))
        out[f"legacy {form}"] = checkpoint_wrapped(model)
    legacy_too = {"activation_checkpointing": Block}
    with pytest.raises(ValueError, match="activation_checkpointing"):
        build(ctx, "fsdp", activation_checkpointing_policy={Block}, extra=legacy_too)
    return out


@pytest.mark.clause("CFG-4")
def test_policies_in_every_accepted_form() -> None:
    plain = build_model(SPEC, "meta")
    units = sorted(WrapSpec("classes", ("Block",)).expected_units(plain) | {""})
    checkpointed = sorted(ACSpec("classes", ("Block",)).expected_wrapped(plain))
    for rank, seen in enumerate(run_on_ranks(_policy_rank, world_size=job_world())):
        for key, value in seen.items():
            expected = units if key.startswith("wrap") else checkpointed
            assert value == expected, (
                f"rank {rank}: {key} selected {value}; every Block (and only Blocks) "
                f"should be: {expected}"
            )


# --- CFG-5 ------------------------------------------------------------------------------


def _orig_params_rank(ctx: Any, scenario: Scenario) -> dict[str, Any]:
    out: dict[str, Any] = {}
    model = build(ctx, "fsdp").setup_module(build_model(SPEC))
    out["default"] = sorted({bool(u._use_orig_params) for u in fsdp_units(model)})
    out["names"] = sorted(n for n, _ in model.named_parameters() if "flat_param" in n)
    flat = {"use_orig_params": False}
    strategy = build(ctx, "fsdp", extra=flat)
    plain = build_model(SPEC)
    early = torch.optim.SGD(plain.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="use_orig_params"):
        strategy.setup_module_and_optimizers(plain, [early])
    strategy = build(ctx, "fsdp", extra=flat)
    plain = build_model(SPEC)
    early = torch.optim.SGD(plain.parameters(), lr=0.1)
    module = strategy.setup_module(plain)
    with pytest.raises(ValueError, match=all_of("setup_module", "creat", ignore_case=True)):
        strategy.setup_optimizer(early)
    optimizer = strategy.setup_optimizer(scenario.optim.build(module.named_parameters()))
    result = RankResult(ctx.rank, ctx.rank)
    train(Trained(strategy, module, optimizer), scenario, result)
    result.state = gathered_state(module)
    out["result"] = result
    return out


@pytest.mark.clause("CFG-5")
def test_use_orig_params() -> None:
    scenario = Scenario(
        job_world(),
        SPEC,
        FSDPConfig(extra=(("use_orig_params", False),)),
        OptimSpec("sgd", lr=0.1),
        TrainPlan(steps=1, batch_size=2),
    )
    results = run_on_ranks(_orig_params_rank, scenario, world_size=scenario.world_size)
    for rank, seen in enumerate(results):
        assert seen["default"] == [True] and not seen["names"], (
            f"rank {rank}: by default FSDP units must use use_orig_params=True; got "
            f"{seen['default']}, flat parameters {seen['names']}"
        )
    assert_parity([seen["result"] for seen in results], scenario)


# --- CFG-6 ------------------------------------------------------------------------------


def _offload_rank(ctx: Any) -> dict[str, Any]:
    from torch.distributed.fsdp import CPUOffload

    supported_families(ctx, ("fsdp",))
    out = {}
    for label, value in (
        ("False", False),
        ("True", True),
        ("CPUOffload(False)", CPUOffload(offload_params=False)),
        ("CPUOffload(True)", CPUOffload(offload_params=True)),
    ):

        def attempt(value: Any = value) -> None:
            strategy = build(ctx, "fsdp", cpu_offload=value)
            model = strategy.setup_module(build_model(SPEC))
            loss = model(torch.randn(2, SPEC.in_features, device=ctx.device)).sum()
            strategy.backward(loss, model)

        out[label] = outcome(attempt)
    return out


@pytest.mark.clause("CFG-6")
def test_cpu_offload_of_parameters_without_an_accelerator_is_refused() -> None:
    if has_accelerator():
        pytest.skip("environment: CFG-6's refusal applies to machines without an accelerator")
    for rank, seen in enumerate(run_on_ranks(_offload_rank, world_size=job_world())):
        for label in ("False", "CPUOffload(False)"):
            assert seen[label] == ("ok", ""), f"rank {rank}: cpu_offload={label}: {seen[label]}"
        for label in ("True", "CPUOffload(True)"):
            kind, message = seen[label]
            assert kind in ("ValueError", "unsupported") and "cpu_offload" in message, (
                f"rank {rank}: cpu_offload={label} on a machine without an accelerator must "
                f"raise ValueError (or be declared Unsupported) naming cpu_offload; got "
                f"{kind}: {message or 'no error'}"
            )
