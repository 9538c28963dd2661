"""Checkpoint plans: what the checkpoint suites save and load, drawn by Hypothesis.

A :class:`CkptPlan` is data: the scenario that trains and saves (world size A), the format,
the scenario that loads (world size B, possibly the other family, a fresh seed and learning
rate so that a loader that does nothing is caught), and the user metadata saved beside the
model (ints, tensors, nested containers, an object with ``state_dict``/``load_state_dict``),
part of it requested on load. :func:`ckpt_plans` draws valid plans (both families and
formats, any pair of world sizes up to ``--nproc``, 0-2 steps so that some optimizers never
stepped, frozen and tied parameters and several groups through the part-1 scenarios);
:func:`load_scenarios` draws the load side. :class:`ReorderedOptim` and
:func:`plain_train` give the plain torch side of the interop tests.

Rank-side jobs are in :mod:`suites.checkpoint_jobs`, controller-side comparisons in
:mod:`suites.checkpoint_checks`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import settings
from hypothesis import strategies as st
from torch.optim import Optimizer

from suites.lib.controller.scenarios import (
    available_world_sizes,
    fsdp_configs,
    scenarios,
    train_plans,
    world_sizes,
)
from suites.lib.shared.models import ModelSpec, make_batch
from suites.lib.shared.specs import MPConfig, OptimSpec, Scenario

__all__ = [
    "FAMILIES",
    "FORMATS",
    "META_KINDS",
    "PRECISIONS",
    "CkptPlan",
    "Counter",
    "ReorderedOptim",
    "ckpt_plans",
    "examples",
    "format_options",
    "fresh_metadata",
    "load_scenarios",
    "make_metadata",
    "plain_metadata",
    "plain_train",
    "world_pairs",
]

FAMILIES = ("fsdp", "model_parallel")


FORMATS = ("full", "sharded")


META_KINDS = ("stateful", "nested", "tensor", "int")


_META_KEYS = {"int": "step", "tensor": "rng", "nested": "nested", "stateful": "counter"}


#: precisions whose master state is fp32 and that both families run
PRECISIONS = ("32-true", "bf16-mixed")


def examples(n: int) -> settings:
    """``n`` examples in the ``ci`` profile, scaled like the active profile otherwise."""
    base = settings().max_examples  # the active profile's: ci 10, dev 25, nightly 250
    return settings(max_examples=max(1, n * base // 10))


def format_options(family: str, fmt: str) -> dict[str, Any]:
    """The strategy option that selects checkpoint format ``fmt`` for ``family``."""
    if fmt not in FORMATS:
        raise ValueError(f"fmt={fmt!r} is not a checkpoint format; use one of {FORMATS}.")
    if family == "fsdp":
        return {"state_dict_type": fmt}
    return {"save_distributed_checkpoint": fmt == "sharded"}


class Counter:
    """User metadata with ``state_dict``/``load_state_dict`` (saved through them)."""

    def __init__(self, n: int = 0) -> None:
        self.n = n
        self.history = torch.arange(float(n))

    def state_dict(self) -> dict[str, Any]:
        """``{"n": int, "history": tensor}``."""
        return {"n": self.n, "history": self.history.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``n`` and ``history``."""
        self.n, self.history = int(state["n"]), state["history"].clone()


def make_metadata(kinds: tuple[str, ...]) -> dict[str, Any]:
    """The metadata a plan saves: one entry per kind (key ``_META_KEYS[kind]``)."""
    values = {
        "int": 7,
        "tensor": torch.arange(4.0) * 0.5,
        "nested": {"epoch": 3, "lrs": [0.1, 0.05], "name": "run-1", "t": {"m": torch.ones(2, 3)}},
        "stateful": Counter(5),
    }
    return {_META_KEYS[k]: values[k] for k in kinds}


def fresh_metadata(keys: tuple[str, ...]) -> dict[str, Any]:
    """Values of the requested metadata keys before a load (all different from the saved)."""
    values = {"step": -1, "rng": torch.zeros(4), "nested": {"old": True}, "counter": Counter(0)}
    return {k: values[k] for k in keys}


def plain_metadata(meta: dict[str, Any]) -> dict[str, Any]:
    """Metadata as data: a stateful object becomes its ``state_dict()``."""
    return {k: v.state_dict() if isinstance(v, Counter) else v for k, v in meta.items()}


@dataclass(frozen=True)
class CkptPlan:
    """One checkpoint round trip, as data.

    Args:
        save: the scenario that trains ``save.plan.steps`` steps (0: never stepped) and saves.
        fmt: ``full`` or ``sharded``.
        load: the scenario that loads (its world size, family and strategy options; a fresh
            seed and learning rate so that a loader that does nothing is caught).
        meta: kinds of user metadata saved beside the model.
        requested: the metadata keys requested on load (the rest must be returned).
    """

    save: Scenario
    fmt: str
    load: Scenario
    meta: tuple[str, ...] = ("int",)
    requested: tuple[str, ...] = ("step",)

    @property
    def worlds(self) -> str:
        """``"save at world size A, load at world size B"`` for failure messages."""
        return (
            f"saved at world size {self.save.world_size} ({self.save.family}, {self.fmt}), "
            f"loaded at world size {self.load.world_size} ({self.load.family})"
        )


def world_pairs(min_world: int = 2) -> st.SearchStrategy[tuple[int, int]]:
    """Every ordered pair of different world sizes in ``[min_world, --nproc]``.

    A run with a single world size (attach mode) skips the check as ``environment``.
    """
    runnable = [s for s in available_world_sizes() if s >= min_world]
    if len(runnable) < 2:
        pytest.skip(
            f"environment: resharding needs two world sizes >= {min_world}; this run has "
            f"{runnable or 'none'} (attach mode runs torchrun's world size only)"
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
    else:
        ffn = [b.ffn for b in spec.blocks]
        shapes = [m for m in _shapes(world) if all(f % m[1] == 0 for f in ffn)]
        dp, tp = draw(st.sampled_from(shapes))
        config = MPConfig(
            data_parallel_size=dp,
            tensor_parallel_size=tp,
            tp_plan="mlp" if tp > 1 else draw(st.sampled_from(_plans_on_one_wide_tp(ffn))),
            fsdp_classes=tuple(
                draw(st.lists(st.sampled_from(("Block", "NestedBlock")), unique=True))
            ),
            precision=save.precision,
        )
    optim = dataclasses.replace(save.optim, lr=save.optim.lr * 2)
    return Scenario(world, spec, config, optim, save.plan, save.empty_init)


def _plans_on_one_wide_tp(ffn: list[int]) -> tuple[str, ...]:
    """The tensor-parallel plans a load may apply on a 1-wide tensor-parallel dim.

    The ``mlp`` plan there only when every MLP is wider than 1: with ``ffn=1`` the
    column-wise ``fc1`` makes a ``[1, 1]`` ``Shard(1)`` gradient whose view to ``[1]``
    torch's DTensor cannot propagate ("would remove or reshape sharded dimension 1"), in
    training, without any checkpoint (the torch limit :func:`~suites.scenarios.mp_configs`
    avoids by drawing no plan at ``tp=1``).
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
    min_world: int = 2,
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
        min_world: smallest world size drawn.
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
    keys = [_META_KEYS[k] for k in kinds]
    most = max(1, len(keys) - 1)  # with two kinds or more, at least one is not requested
    requested = tuple(draw(st.lists(st.sampled_from(keys), min_size=1, max_size=most, unique=True)))
    return CkptPlan(save, fmt, load, kinds, requested)


@dataclass(frozen=True)
class ReorderedOptim(OptimSpec):
    """An :class:`~suites.specs.OptimSpec` whose groups come in reverse order, each group's
    parameters reversed too: integer ids in ``param_groups`` order then differ from
    ``model.parameters()`` order (CKPT-REKEY-1)."""

    def build(self, named_params: Iterable[tuple[str, torch.nn.Parameter]]) -> Optimizer:
        """The reordered optimizer over ``named_params``."""
        opt = super().build(named_params)
        groups = [{**g, "params": list(reversed(g["params"]))} for g in reversed(opt.param_groups)]
        cls: Any = type(opt)
        reordered: Optimizer = cls(groups[0]["params"])  # then the groups exactly as built
        reordered.param_groups.clear()
        for group in groups:
            reordered.add_param_group(group)
        return reordered


def plain_train(scenario: Scenario, model: torch.nn.Module, optimizer: Optimizer) -> None:
    """Train the plain model in this process for ``scenario.plan.steps`` steps (one rank's
    data, one micro-batch per step): what a user's plain torch run does."""
    plan = scenario.plan
    for step in range(plan.steps):
        x, y = make_batch(scenario.model, plan.data_seed, step, 0, 0, plan.batch_size)
        F.mse_loss(model(x).float(), y).backward()
        optimizer.step()
        optimizer.zero_grad()
