"""Rank side of the construction and validation checks (``test_config.py``: CFG-1..CFG-6,
the fsdp family's options, CFG-3 and CFG-4 the fsdp2 family's too;
``test_config_general.py``: CFG-7..CFG-10, both families).

Each job builds strategies through the plug-in contract with the helpers of
:mod:`suites.lib.ranks.construction` and records, per value tried, what torch built or which
error the strategy raised; the controller checks every rank's record.
"""

from __future__ import annotations

import os
import re
import warnings
from typing import Any

import pytest
import torch

from harness import Unsupported, torch_compat
from suites.lib.ranks.construction import (
    SPEC,
    all_of,
    build,
    each_family,
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
from suites.lib.shared.specs import Scenario

__all__ = [
    "EVERY_FAMILY",
    "PRECISIONS",
    "PUBLIC_SHARDING",
    "SELF_SHARDING",
    "device_mesh_rank",
    "foreign_options",
    "honour_rank",
    "hybrid_rank",
    "mp_sizes_rank",
    "offload_forms",
    "offload_rank",
    "orig_params_rank",
    "parallelize_fn_rank",
    "policy_rank",
    "precision_rank",
    "sharding_rank",
]


# --- CFG-1..CFG-6 (test_config.py) ------------------------------------------------------

PUBLIC_SHARDING = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD")


def sharding_rank(ctx: Any, names: list[Any], bad: list[Any]) -> list[tuple[str, str, list[str]]]:
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


def hybrid_rank(ctx: Any) -> dict[str, Any]:
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


#: the families whose ``device_mesh`` and policy options CFG-3 and CFG-4 speak of
SELF_SHARDING = ("fsdp", "fsdp2")


def device_mesh_rank(
    ctx: Any, name: str, shapes: list[tuple[int, int]], as_object: bool
) -> dict[str, list[tuple[Any, ...]]]:
    """Per family of :data:`SELF_SHARDING` the strategy builds: for each ``(replicate,
    shard)`` shape, as a tuple or (``as_object``) a ``DeviceMesh``, ``("refused", message,
    device type)`` (the product is not the world size) or ``("built", layout, device type)``.
    The layout is, for the fsdp family (``sharding_strategy=name``), the units' sorted
    :func:`~suites.lib.ranks.construction.unit_groups`; for the fsdp2 family, the parameters'
    sorted ``(mesh shape, mesh device type, placements)`` (``(None, None, ())``: a parameter
    that is not a DTensor)."""
    from torch.distributed.device_mesh import init_device_mesh

    world = ctx.world_size

    def options(family: str, mesh: Any) -> dict[str, Any]:
        named_sharding = {"sharding_strategy": name} if family == "fsdp" else {}
        return {**named_sharding, "device_mesh": mesh}

    def layout(family: str, model: torch.nn.Module) -> list[Any]:
        if family == "fsdp":
            return sorted({unit_groups(u) for u in fsdp_units(model)})
        found = set()
        for p in model.parameters():
            mesh = getattr(p, "device_mesh", None)  # None: not a DTensor
            placements = tuple(repr(x) for x in getattr(p, "placements", ()))
            shape = tuple(mesh.shape) if mesh is not None else None
            found.add((shape, mesh.device_type if mesh is not None else None, placements))
        return sorted(found, key=repr)

    def shapes_of(family: str) -> list[tuple[Any, ...]]:
        out: list[tuple[Any, ...]] = []
        for replicate, shard in shapes:
            if replicate * shard != world:
                shape = (replicate, shard)
                message = expect_error(
                    ValueError,
                    all_of(number(replicate), number(shard), number(world)),
                    f"{family}: device_mesh={shape} at world size {world}",
                    lambda shape=shape: build(ctx, family, **options(family, shape)),
                    allow_unsupported=True,
                )
                out.append(("refused", message, ctx.device.type))
                continue
            mesh: Any = (replicate, shard)
            if as_object:
                mesh = init_device_mesh(
                    ctx.device.type, mesh, mesh_dim_names=("replicate", "shard")
                )
            strategy = build(ctx, family, **options(family, mesh))
            model = strategy.setup_module(build_model(SPEC))
            out.append(("built", layout(family, model), ctx.device.type))
        return out

    return each_family(ctx, SELF_SHARDING, shapes_of)


def _policies() -> dict[str, Any]:
    """Every accepted form of a policy that selects the instances of the zoo's Block."""
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


def policy_rank(ctx: Any) -> dict[str, dict[str, Any]]:
    """Per family of :data:`SELF_SHARDING` the strategy builds: the units (``wrap FORM``)
    and the checkpointed modules (``checkpoint FORM``, ``legacy FORM``) that each accepted
    form of a policy selecting the Blocks gives."""
    from suites.lib.ranks.structure import checkpoint_wrapped, fsdp1_units, fsdp2_units

    def forms(family: str) -> dict[str, Any]:
        units = fsdp1_units if family == "fsdp" else fsdp2_units
        out: dict[str, Any] = {}
        for form, policy in _policies().items():
            model = build(ctx, family, auto_wrap_policy=policy).setup_module(build_model(SPEC))
            out[f"wrap {form}"] = sorted(units(model))
            strategy = build(ctx, family, activation_checkpointing_policy=policy)
            out[f"checkpoint {form}"] = checkpoint_wrapped(strategy.setup_module(build_model(SPEC)))
        for form, legacy in (("class", Block), ("list", [Block])):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                strategy = build(ctx, family, extra={"activation_checkpointing": legacy})
            deprecations = [
                str(w.message)
                for w in caught
                if issubclass(w.category, (DeprecationWarning, FutureWarning))
                or "deprecat" in str(w.message).lower()
            ]
            assert deprecations, (
                f"{family}: activation_checkpointing={legacy} gave no deprecation warning "
                f"(warnings: {[str(w.message) for w in caught]})"
            )
            model = strategy.setup_module(build_model(SPEC))
            out[f"legacy {form}"] = checkpoint_wrapped(model)
        legacy_too = {"activation_checkpointing": Block}
        expect_error(
            ValueError,
            "activation_checkpointing",
            f"{family}: activation_checkpointing together with activation_checkpointing_policy",
            lambda: build(ctx, family, activation_checkpointing_policy={Block}, extra=legacy_too),
        )
        return out

    return each_family(ctx, SELF_SHARDING, forms)


def orig_params_rank(ctx: Any, scenario: Scenario) -> dict[str, Any]:
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


def offload_forms(family: str) -> tuple[tuple[str, Any, bool], ...]:
    """CFG-6's values of ``cpu_offload`` for ``family``: ``(label, value, offloads)``, a bool
    or the family's own object (FSDP1's ``CPUOffload``, FSDP2's ``OffloadPolicy``)."""
    from torch.distributed.fsdp import CPUOffload, CPUOffloadPolicy, OffloadPolicy

    if family == "fsdp2":
        return (
            ("False", False, False),
            ("True", True, True),
            ("OffloadPolicy()", OffloadPolicy(), False),
            ("CPUOffloadPolicy()", CPUOffloadPolicy(), True),
        )
    return (
        ("False", False, False),
        ("True", True, True),
        ("CPUOffload(False)", CPUOffload(offload_params=False), False),
        ("CPUOffload(True)", CPUOffload(offload_params=True), True),
    )


def offload_rank(ctx: Any, family: str) -> dict[str, Any]:
    """CFG-6 on a machine without an accelerator: each form of ``cpu_offload`` for
    ``family`` (:func:`offload_forms`), built, set up and run through a backward; what it
    gave (``outcome``)."""
    supported_families(ctx, (family,))
    out = {}
    for label, value, _ in offload_forms(family):

        def attempt(value: Any = value) -> None:
            strategy = build(ctx, family, cpu_offload=value)
            model = strategy.setup_module(build_model(SPEC))
            loss = model(torch.randn(2, SPEC.in_features, device=ctx.device)).sum()
            strategy.backward(loss, model)

        out[label] = outcome(attempt)
    return out


# --- CFG-7..CFG-10 (test_config_general.py) --------------------------------------------

PRECISIONS = ("32-true", "16-true", "bf16-true", "16-mixed", "bf16-mixed")
#: CFG-7 and CFG-10 speak of every family: each one the strategy offers is checked
EVERY_FAMILY = ("fsdp", "model_parallel", "fsdp2")


def precision_rank(ctx: Any, bad: list[Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for family in supported_families(ctx, EVERY_FAMILY):
        for precision in PRECISIONS:
            try:
                plugin = build(ctx, family, precision=precision).precision
            except Unsupported:  # accepted, but not runnable by this strategy here
                continue
            out[f"{family} {precision}"] = [
                callable(getattr(plugin, m, None)) for m in ("forward_context", "convert_input")
            ]
        for value in bad:
            expect_error(
                (TypeError, ValueError),
                named(value),
                f"{family} precision={value!r}",
                lambda family=family, value=value: build(ctx, family, precision=value),
            )
    return out


def mp_sizes_rank(ctx: Any, sizes: list[tuple[int, int]]) -> list[Any]:
    world = ctx.world_size
    out: list[Any] = []
    for dp, tp in [("auto", "auto"), *sizes]:
        options = {"data_parallel_size": dp, "tensor_parallel_size": tp}
        if dp == "auto" or dp * tp == world:
            mesh = build(ctx, "model_parallel", **options).device_mesh
            out.append((tuple(mesh.shape), tuple(mesh.mesh_dim_names or ()), mesh.device_type))
            if dp == "auto":  # the node layout 'auto' is read from (torchrun's, or one node)
                out[-1] += (int(os.environ.get("LOCAL_WORLD_SIZE", world)),)
            continue
        expect_error(
            RuntimeError,
            all_of(number(dp), number(tp), number(world)),
            f"data_parallel_size={dp}, tensor_parallel_size={tp} at world size {world}",
            lambda options=options: build(ctx, "model_parallel", **options),
        )
        out.append("refused")
    return out


def _returns(value: Any) -> Any:
    return lambda module, device_mesh: value


def parallelize_fn_rank(ctx: Any) -> list[str]:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    messages = []
    for value in (None, (torch.nn.Linear(2, 2),), torch.zeros(2), "module"):
        strategy = build(ctx, "model_parallel", parallelize_fn=_returns(value))
        kind = type(value).__name__
        messages.append(
            expect_error(
                TypeError,
                all_of("parallelize_fn", re.escape(kind)),
                f"a parallelize_fn that returns a {kind}",
                lambda strategy=strategy: strategy.setup_module(build_model(SPEC)),
            )
        )
    model = build_model(SPEC, ctx.device)
    model.blocks[0] = FSDP(model.blocks[0], device_id=ctx.device)
    strategy = build(ctx, "model_parallel")
    with pytest.raises(TypeError, match=r"FullyShardedDataParallel|FSDP") as info:
        strategy.setup_module(model)
    messages.append(str(info.value))
    return messages


def foreign_options(world: int) -> dict[str, dict[str, Any]]:
    """Options of the other family, each set to a non-default value valid at ``world`` ranks
    (a mesh of the world): a strategy may not ignore them.

    Args:
        world: the job's world size.
    """
    return {
        "fsdp": {
            "data_parallel_size": world,
            "tensor_parallel_size": 1,
            "save_distributed_checkpoint": False,
        },
        "model_parallel": {
            "sharding_strategy": "NO_SHARD",
            "auto_wrap_policy": {Block},
            "activation_checkpointing_policy": {Block},
            "state_dict_type": "full",
            "device_mesh": (1, world),
        },
        # fsdp2 reads the fsdp fields that mean the same for fully_shard, not FSDP1's
        # sharding strategy, and none of model_parallel's
        "fsdp2": {
            "sharding_strategy": "NO_SHARD",
            "data_parallel_size": world,
            "tensor_parallel_size": 1,
            "save_distributed_checkpoint": False,
        },
    }


UNKNOWN = "definitely_not_an_option"


def honour_rank(ctx: Any) -> dict[str, tuple[str, str]]:
    from torch.distributed.fsdp import FSDPModule, fully_shard

    def attempt(family: str, **options: Any) -> Any:
        return lambda: build(ctx, family, **options).setup_module(build_model(SPEC))

    out = {}
    families = supported_families(ctx, EVERY_FAMILY)
    for family in families:
        out[f"{family} {UNKNOWN}"] = outcome(attempt(family, extra={UNKNOWN: 1}))
        for option, value in foreign_options(ctx.world_size)[family].items():
            out[f"{family} {option}"] = outcome(attempt(family, **{option: value}))
    for family in [f for f in ("fsdp", "fsdp2") if f in families]:
        out[f"{family} state_dict_type"] = outcome(attempt(family, state_dict_type="nonsense"))
    if "model_parallel" not in families:
        return out
    out["model_parallel data_parallel_size"] = outcome(
        attempt("model_parallel", data_parallel_size=0)
    )

    def no_policy(module: torch.nn.Module, device_mesh: Any) -> torch.nn.Module:
        return fully_shard(module, mesh=device_mesh["data_parallel"])  # no mp_policy

    def mixed() -> str:
        strategy = build(ctx, "model_parallel", precision="bf16-mixed", parallelize_fn=no_policy)
        model = strategy.setup_module(build_model(SPEC))
        dtypes = {
            torch_compat.fsdp2_mp_policy(m).param_dtype
            for m in model.modules()
            if isinstance(m, FSDPModule)
        }
        if dtypes != {torch.bfloat16}:
            raise AssertionError(f"precision ignored: FSDP2 param_dtype {dtypes}")
        return "honoured"

    out["model_parallel precision"] = outcome(mixed)
    return out
