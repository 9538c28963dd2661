"""Helpers of the construction and validation tests (CONTRACT.md CFG-1..CFG-10), rank side.

Strategies are built only through the plug-in contract (``ctx.make_strategy``); an error
from the factory or from ``setup_environment`` counts as an error "at construction". The
pattern helpers build ``pytest.raises(..., match=...)`` patterns that need several key words
of a message, in any order.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Literal, TypeVar, overload

import pytest
import torch

from harness import MeshStrategy, RankContext, Strategy, Unsupported
from suites.lib.shared.models import BlockSpec, ModelSpec
from suites.lib.shared.specs import MPConfig

__all__ = [
    "SPEC",
    "all_of",
    "build",
    "each_family",
    "expect_error",
    "fsdp_units",
    "named",
    "number",
    "outcome",
    "supported_families",
    "unit_groups",
]

T = TypeVar("T")

FAMILIES = ("fsdp", "model_parallel")
#: a Block and a NestedBlock (wrap units inside a unit), a Scale and a head
SPEC = ModelSpec(
    hidden=4, blocks=(BlockSpec(ffn=2), BlockSpec(kind="NestedBlock", ffn=2, inner=1)), seed=7
)


def all_of(*patterns: str, ignore_case: bool = False) -> str:
    """A ``match=`` pattern that needs every one of ``patterns``, in any order."""
    return ("(?is)" if ignore_case else "(?s)") + "^" + "".join(f"(?=.*{p})" for p in patterns)


def number(n: int) -> str:
    """A pattern for ``n`` as a whole number (``2`` does not match in ``12``)."""
    return rf"(?<!\d){n}(?!\d)"


def named(value: Any) -> str:
    """A pattern for a message that names ``value`` (its str or its repr)."""
    return f"(?:{re.escape(str(value))}|{re.escape(repr(value))})"


def expect_error(
    types: type[Exception] | tuple[type[Exception], ...],
    pattern: str,
    what: str,
    fn: Callable[[], Any],
    *,
    allow_unsupported: bool = False,
) -> str:
    """``fn()`` must raise one of ``types`` with a message matching ``pattern``.

    Runs ``fn`` under ``pytest.raises(types, match=pattern)``; a failure (nothing raised,
    another type, a message without the key words) names ``what`` (e.g. the option and value).

    Args:
        types: the accepted exception type(s).
        pattern: what the message must match (see :func:`all_of`).
        what: the input, for the failure message.
        fn: the call that must raise.
        allow_unsupported: let ``Unsupported`` through (the whole feature, e.g. hybrid
            sharding, is not supported: the check is then unsupported, not failed).

    Returns:
        The error's message.
    """
    try:
        with pytest.raises(types, match=pattern) as info:
            fn()
    except pytest.fail.Exception as exc:
        pytest.fail(f"{what}: {exc}", pytrace=False)
    except Unsupported:
        if allow_unsupported:
            raise
        pytest.fail(f"{what}: expected {types}, got Unsupported", pytrace=False)
    except Exception as exc:
        pytest.fail(f"{what}: expected {types}, got {type(exc).__name__}: {exc}", pytrace=False)
    return str(info.value)


@overload
def build(ctx: RankContext, family: Literal["model_parallel"], **options: Any) -> MeshStrategy: ...


@overload
def build(ctx: RankContext, family: str, **options: Any) -> Strategy: ...


def build(ctx: RankContext, family: str, **options: Any) -> Strategy:
    """``ctx.make_strategy(family, **options)``, then ``setup_environment()``.

    Args:
        ctx: the harness ``RankContext``.
        family: ``fsdp`` or ``model_parallel``; the latter gets the suites' parallelize_fn
            (Blocks and the root as FSDP2 units) and ``data_parallel_size`` = the world
            unless ``options`` say otherwise.
        **options: ``StrategySpec`` fields.
    """
    if family == "model_parallel":
        options.setdefault("parallelize_fn", MPConfig(fsdp_classes=("Block",)).parallelize_fn())
        options.setdefault("data_parallel_size", ctx.world_size)
        options.setdefault("tensor_parallel_size", 1)
    strategy = ctx.make_strategy(family, **options)
    strategy.setup_environment()
    return strategy


def supported_families(ctx: RankContext, families: tuple[str, ...] = FAMILIES) -> list[str]:
    """The families whose default configuration the strategy builds (not ``Unsupported``).

    A check about bad input of a family the strategy does not offer at all is unsupported,
    not failed: if no family of ``families`` is supported, the last ``Unsupported`` is raised.
    """
    supported, refusal = [], None
    for family in families:
        try:
            build(ctx, family)
        except Unsupported as exc:
            refusal = exc
            continue
        supported.append(family)
    if refusal is not None and not supported:
        raise refusal
    return supported


def each_family(
    ctx: RankContext, families: tuple[str, ...], job: Callable[[str], T]
) -> dict[str, T]:
    """``job(family)`` for each of ``families`` the strategy builds
    (:func:`supported_families`), by family. A family whose job raises ``Unsupported`` (the
    strategy builds its default configuration but not the one the job asks for) is left out,
    so that one family's refusal does not hide another's results; when every family is left
    out, the last ``Unsupported`` is raised (the check is then unsupported, not failed).
    """
    out: dict[str, T] = {}
    refusal: Unsupported | None = None
    for family in supported_families(ctx, families):
        try:
            out[family] = job(family)
        except Unsupported as exc:
            refusal = exc
    if refusal is not None and not out:
        raise refusal
    return out


def fsdp_units(model: torch.nn.Module) -> list[Any]:
    """The FSDP1 units of ``model`` (torch's objects), root first."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    return [m for m in model.modules() if isinstance(m, FSDP)]


def outcome(fn: Callable[[], Any]) -> tuple[str, str]:
    """Run ``fn``: ``("ok", "")``, ``("unsupported", description)`` or ``(type, message)``."""
    try:
        fn()
    except Unsupported as exc:
        return "unsupported", exc.describe()
    except Exception as exc:
        return type(exc).__name__, str(exc)
    return "ok", ""


def unit_groups(unit: Any) -> tuple[Any, ...]:
    """An FSDP1 unit's (sharding strategy, shard group size, replicate group size or None,
    device type of its device mesh or None), read from torch's FSDP state."""
    inter = unit.__dict__.get("_inter_node_pg")
    mesh = unit.__dict__.get("_device_mesh")
    return (
        unit.sharding_strategy.name,
        unit.process_group.size(),
        inter.size() if inter is not None else None,
        mesh.device_type if mesh is not None else None,
    )
