"""CONTRACT.md CFG-7..CFG-10, for both families.

The precision (both families), the model_parallel mesh sizes and ``parallelize_fn``, and the
rule that an option is honoured or refused with an error naming it, never ignored. See
``test_config.py`` for how errors are checked (CFG-1..CFG-6 are there).
"""

from __future__ import annotations

import re
import string
from typing import Any

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from harness import Unsupported, run_on_ranks, torch_compat
from suites.lib.controller.scenarios import job_world, world_sizes
from suites.lib.ranks.construction import (
    SPEC,
    all_of,
    build,
    expect_error,
    named,
    number,
    outcome,
    supported_families,
)
from suites.lib.shared.models import Block, build_model

PRECISIONS = ("32-true", "16-true", "bf16-true", "16-mixed", "bf16-mixed")
NEAR_MISS_PRECISION = ("32", "16", "bf16", "fp16-mixed", "64-true", "16-mixed ", "mixed", "")


class NotAPrecision:
    """An object that is no precision."""

    def __repr__(self) -> str:
        return "NotAPrecision()"


# --- CFG-7 ------------------------------------------------------------------------------

BAD_PRECISION = st.one_of(
    st.sampled_from(NEAR_MISS_PRECISION),
    st.text(string.ascii_letters + string.digits + "-", max_size=12).filter(
        lambda s: s not in PRECISIONS
    ),
    st.sampled_from((16, 32, 16.0, torch.float16, torch.bfloat16, ["32-true"], NotAPrecision())),
)


def _precision_rank(ctx: Any, bad: list[Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for family in supported_families(ctx):
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


@pytest.mark.clause("CFG-7")
@given(bad=st.lists(BAD_PRECISION, min_size=1, max_size=6))
@example(bad=[*NEAR_MISS_PRECISION, 16, torch.float16, NotAPrecision()])
def test_precision_is_one_of_five(bad: list[Any]) -> None:
    for rank, seen in enumerate(run_on_ranks(_precision_rank, bad, world_size=job_world())):
        for key, plugin_methods in seen.items():
            assert plugin_methods == [True, True], (
                f"rank {rank}: {key}: the precision plugin lacks forward_context/convert_input"
            )


# --- CFG-8 ------------------------------------------------------------------------------


def _mp_sizes_rank(ctx: Any, sizes: list[tuple[int, int]]) -> list[Any]:
    world = ctx.world_size
    out: list[Any] = []
    for dp, tp in [("auto", "auto"), *sizes]:
        options = {"data_parallel_size": dp, "tensor_parallel_size": tp}
        if dp == "auto" or dp * tp == world:
            mesh = build(ctx, "model_parallel", **options).device_mesh
            out.append((tuple(mesh.shape), tuple(mesh.mesh_dim_names or ()), mesh.device_type))
            continue
        expect_error(
            RuntimeError,
            all_of(number(dp), number(tp), number(world)),
            f"data_parallel_size={dp}, tensor_parallel_size={tp} at world size {world}",
            lambda options=options: build(ctx, "model_parallel", **options),
        )
        out.append("refused")
    return out


@pytest.mark.clause("CFG-8")
@given(
    world=world_sizes(),
    sizes=st.lists(st.tuples(st.integers(1, 8), st.integers(1, 8)), min_size=1, max_size=4),
)
@example(world=2, sizes=[(2, 1), (1, 2), (2, 2), (1, 1)])
def test_model_parallel_sizes(world: int, sizes: list[tuple[int, int]]) -> None:
    names = ("data_parallel", "tensor_parallel")
    for rank, seen in enumerate(run_on_ranks(_mp_sizes_rank, sizes, world_size=world)):
        auto, rest = seen[0], seen[1:]
        assert auto[:2] == ((1, world), names), (
            f"rank {rank}: data_parallel_size/tensor_parallel_size 'auto' on one node built a "
            f"mesh {auto}; expected shape (1, {world}) (nodes x processes per node), {names}"
        )
        for (dp, tp), got in zip(sizes, rest, strict=True):
            expected = ((dp, tp), names, auto[2]) if dp * tp == world else "refused"
            assert got == expected, f"rank {rank}: sizes {(dp, tp)} at world {world}: {got}"


# --- CFG-9 ------------------------------------------------------------------------------


def _returns(value: Any) -> Any:
    return lambda module, device_mesh: value


def _parallelize_fn_rank(ctx: Any) -> list[str]:
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


@pytest.mark.clause("CFG-9")
def test_parallelize_fn_must_return_a_module_and_fsdp1_is_refused() -> None:
    for rank, messages in enumerate(run_on_ranks(_parallelize_fn_rank, world_size=job_world())):
        assert len(messages) == 5, f"rank {rank}: {messages}"


# --- CFG-10 -----------------------------------------------------------------------------


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
    }


UNKNOWN = "definitely_not_an_option"


def _honour_rank(ctx: Any) -> dict[str, tuple[str, str]]:
    from torch.distributed.fsdp import FSDPModule, fully_shard

    def attempt(family: str, **options: Any) -> Any:
        return lambda: build(ctx, family, **options).setup_module(build_model(SPEC))

    out = {}
    families = supported_families(ctx)
    for family in families:
        out[f"{family} {UNKNOWN}"] = outcome(attempt(family, extra={UNKNOWN: 1}))
        for option, value in foreign_options(ctx.world_size)[family].items():
            out[f"{family} {option}"] = outcome(attempt(family, **{option: value}))
    if "fsdp" in families:
        out["fsdp state_dict_type"] = outcome(attempt("fsdp", state_dict_type="nonsense"))
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


@pytest.mark.clause("CFG-10")
def test_options_are_honoured_or_refused_never_ignored() -> None:
    for rank, seen in enumerate(run_on_ranks(_honour_rank, world_size=job_world())):
        for key, (kind, message) in seen.items():
            option = key.split(" ", 1)[1]
            if option == "precision" and kind == "ok":
                continue  # the strategy applied bf16 itself: honoured
            assert kind != "ok" and option in message and kind != "AssertionError", (
                f"rank {rank}: {key}: a strategy that cannot honour an option must say so "
                f"with an error naming it; got {kind}: {message or 'no error (ignored)'}"
            )
