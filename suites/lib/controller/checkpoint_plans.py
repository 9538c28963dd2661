"""Checkpoint plans drawn by Hypothesis: what the checkpoint suites save and load.

:func:`ckpt_plans` draws valid :class:`~suites.lib.shared.checkpoint_specs.CkptPlan` s (both
families and formats, any pair of world sizes up to ``--nproc``, 0-2 steps so that some
optimizers never stepped, frozen and tied parameters and several groups through the part-1
scenarios); :func:`load_scenarios` draws the load side and :func:`world_pairs` two world sizes.

The plan itself and its metadata are data that both sides use
(:mod:`suites.lib.shared.checkpoint_specs`); the rank-side jobs are in
:mod:`suites.lib.ranks.checkpoint_jobs`, the controller-side comparisons in
:mod:`suites.lib.controller.checkpoint_checks`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import pytest
from hypothesis import strategies as st

from suites.lib.controller.scenarios import (
    MP_UNIT_CLASSES,
    available_world_sizes,
    fsdp2_configs,
    fsdp_configs,
    scenarios,
    smallest_world,
    train_plans,
    world_sizes,
)
from suites.lib.shared.checkpoint_specs import FORMATS, META_KEYS, META_KINDS, CkptPlan
from suites.lib.shared.models import ModelSpec, tp_widths
from suites.lib.shared.specs import MPConfig, Scenario

__all__ = ["FAMILIES", "PRECISIONS", "ckpt_plans", "load_scenarios", "world_pairs"]

FAMILIES = ("fsdp", "model_parallel", "fsdp2")


#: precisions whose master state is fp32 and that both families run
PRECISIONS = ("32-true", "bf16-mixed")


def world_pairs(min_world: int | None = None) -> st.SearchStrategy[tuple[int, int]]:
    """Every ordered pair of different world sizes in ``[min_world, --nproc]``.

    A run with a single world size (``--nproc 1``, or torchrun with one rank) skips the
    check as ``environment``.
    """
    min_world = smallest_world() if min_world is None else min_world
    runnable = [s for s in available_world_sizes() if s >= min_world]
    if len(runnable) < 2:
        pytest.skip(
            f"environment: resharding needs two world sizes >= {min_world}; this run has "
            f"{runnable or 'none'}"
        )
    sizes = world_sizes(min_world)
    return st.tuples(sizes, sizes).filter(lambda p: p[0] != p[1])


def _fresh(spec: ModelSpec) -> ModelSpec:
    return dataclasses.replace(spec, seed=spec.seed + 1)


@st.composite
def load_scenarios(
    draw: st.DrawFn, save: Scenario, world: int, family: str | None = None
) -> Scenario:
    """The load side of ``save`` at ``world``: same model tree, fresh seed and learning rate.

    Args:
        save: the saving scenario.
        world: the load world size.
        family: the load family (default: the saving one).
    """
    family = family or save.family
    spec = _fresh(save.model)
    if family == "fsdp":
        config: Any = draw(fsdp_configs(world, spec, precisions=(save.precision,)))
    elif family == "fsdp2":
        config = draw(fsdp2_configs(world, spec, precisions=(save.precision,)))
    else:
        ffn = [b.ffn for b in spec.blocks] + ([spec.shared_ffn] if spec.shared else [])
        shapes = [m for m in _shapes(world) if all(w % m[1] == 0 for w in tp_widths(spec))]
        dp, tp = draw(st.sampled_from(shapes))
        config = MPConfig(
            data_parallel_size=dp,
            tensor_parallel_size=tp,
            tp_plan="mlp" if tp > 1 else draw(st.sampled_from(_plans_on_one_wide_tp(ffn))),
            fsdp_classes=tuple(draw(st.lists(st.sampled_from(MP_UNIT_CLASSES), unique=True))),
            precision=save.precision,
        )
    optim = dataclasses.replace(save.optim, lr=save.optim.lr * 2)
    return Scenario(world, spec, config, optim, save.plan, save.empty_init)


def _plans_on_one_wide_tp(ffn: list[int]) -> tuple[str, ...]:
    """The tensor-parallel plans a load may apply on a 1-wide tensor-parallel dim.

    The ``mlp`` plan there only when every MLP is wider than 1: with ``ffn=1`` the
    column-wise ``fc1`` makes a ``[1, 1]`` ``Shard(1)`` gradient whose view to ``[1]``
    torch's DTensor cannot propagate ("would remove or reshape sharded dimension 1"), in
    training, without any checkpoint (the torch limit
    :func:`~suites.lib.controller.scenarios.mp_configs` avoids by drawing no plan at ``tp=1``).
    """
    return ("none", "mlp") if min(ffn, default=2) > 1 else ("none",)


def _shapes(world: int) -> list[tuple[int, int]]:
    return [(a, world // a) for a in range(1, world + 1) if world % a == 0]


def _first_is_richest(values: Iterable[Any]) -> st.SearchStrategy[Any]:
    """``sampled_from`` with the most demanding value first: Hypothesis' first example is
    its simplest one, so with few examples per test that one should still train, tie,
    freeze and hold buffers."""
    return st.sampled_from(tuple(values))


@st.composite
def ckpt_plans(
    draw: st.DrawFn,
    family: str | None = None,
    fmt: str | None = None,
    worlds: tuple[int, int] | None = None,
    *,
    load_family: str | None = None,
    reshard: bool = False,
    same_config: bool = False,
    max_steps: int = 2,
    min_steps: int = 0,
    min_world: int | None = None,
) -> CkptPlan:
    """A checkpoint plan; arguments fix what is not drawn.

    Args:
        family: the saving family (drawn from both when None).
        fmt: the format (drawn when None).
        worlds: ``(A, B)``; None: one drawn world size for both, or a drawn pair with
            ``reshard=True``.
        load_family: the loading family (default: the saving one).
        reshard: draw two different world sizes when ``worlds`` is None.
        same_config: load with the saving strategy options (same world and family only),
            so that training on after the load is bitwise comparable.
        max_steps: most training steps before the save (0 steps: an optimizer never stepped).
        min_steps: fewest training steps (1 where plain torch reads the optimizer: torch's
            gathered read initializes the state of an optimizer that never stepped).
        min_world: smallest world size drawn (default: ``smallest_world()``).
    """
    family = family or draw(st.sampled_from(FAMILIES))
    fmt = fmt or draw(st.sampled_from(FORMATS))
    if worlds is None:
        worlds = draw(world_pairs(min_world)) if reshard else (w := draw(world_sizes(min_world)), w)
    plan = draw(train_plans(max_steps=max(1, max_steps), clip=None))
    plan = dataclasses.replace(
        plan, steps=draw(_first_is_richest(range(max_steps, min_steps - 1, -1)))
    )
    tied, frozen, nested, scale = (draw(_first_is_richest((True, False))) for _ in range(4))
    save = draw(
        scenarios(
            family,
            world_size=worlds[0],
            precisions=PRECISIONS,
            optimizers=("adamw", "adam", "sgd"),
            plan=st.just(plan),
            tied=tied,
            frozen=frozen,
            nested=nested,
            scale=scale,
        )
    )
    load = draw(load_scenarios(save, worlds[1], load_family))
    if same_config:
        load = dataclasses.replace(load, strategy=save.strategy)
    kinds = tuple(draw(st.lists(st.sampled_from(META_KINDS), min_size=1, unique=True)))
    keys = [META_KEYS[k] for k in kinds]
    most = max(1, len(keys) - 1)  # with two kinds or more, at least one is not requested
    requested = tuple(draw(st.lists(st.sampled_from(keys), min_size=1, max_size=most, unique=True)))
    return CkptPlan(save, fmt, load, kinds, requested)
