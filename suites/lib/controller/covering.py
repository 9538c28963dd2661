"""The suites' configuration space as data, and a pairwise covering set of scenarios over it.

A Hypothesis check draws its configurations at random: under the derandomized ``ci`` profile
its ten draws are always the same ten, and nothing guarantees that they reach a given pair of
values (a NO_SHARD clip, a 16-true sharded checkpoint). This module declares the space
instead:

- :func:`candidates` enumerates concrete scenarios of both families over the main axes of
  :mod:`suites.lib.shared.axes` (sharding strategy and mesh, precision, wrap kind, world
  size, checkpoint format, and the model zoo's kinds through :data:`COVER_MODELS`), each valid
  as the suites draw them (a hybrid mesh divides the world, tensor-parallel widths divide the
  MLP, 16-true trains with SGD: fp16 Adam's second moment underflows);
- :func:`universe` is every pair of axis values that some candidate takes: the pairs a
  strategy of both families can be asked to support;
- :func:`cover_rows` picks, greedily and deterministically, candidates until every pair of
  the universe is taken by at least one of them (a pairwise covering design). The suite
  ``suites/test_whole_configuration_space.py`` runs each row in every profile, so the ``ci`` run
  exercises every supported pair by construction, not by luck.
- :func:`value_cover` and :func:`covering_examples` do the same for one clause's own check,
  one value at a time: the fewest candidates the check can run that take, among them, every
  value of each axis inside the clause's scope, given to the check as explicit Hypothesis
  examples. They take the place of as many of the profile's random draws, so a check costs
  what it did and reaches every (clause, value) pair in every profile. A check that draws
  inside its body (``st.data()``: Hypothesis gives such a check no explicit example) gets a
  sibling check parametrized by :func:`covering_rows` instead, each row with a checkpoint
  format in turn and :func:`round_trip_plan` to make its plan.

The rows depend only on the world sizes the session can run (``--nproc``, attach mode), so a
row's check id is the same in every run.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from hypothesis import example, settings

from harness.clauses import CLAUSES
from harness.conformance.coverage import pairs_of
from suites.lib.controller.scenarios import (
    MP_PRECISIONS,
    SHARDING_STRATEGIES,
    available_world_sizes,
    valid_wrap,
)
from suites.lib.shared.axes import scenario_axes
from suites.lib.shared.checkpoint_specs import FORMATS, META_KINDS, CkptPlan
from suites.lib.shared.models import BlockSpec, ModelSpec, build_model
from suites.lib.shared.specs import (
    FSDPConfig,
    MPConfig,
    OptimSpec,
    Scenario,
    TrainPlan,
    WrapSpec,
)

__all__ = [
    "COVER_MODELS",
    "CoverRow",
    "candidates",
    "cover_rows",
    "covering_examples",
    "covering_rows",
    "other_family_plan",
    "reshard_plan",
    "richest_block",
    "round_trip_plan",
    "universe",
    "value_cover",
]

T = TypeVar("T", bound=Callable[..., Any])

#: precisions of the fsdp family, in the order rows prefer them
FSDP_COVER_PRECISIONS = ("32-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true")

#: the model variants the cover draws from: together they take every model kind of the zoo
#: (plain and nested blocks, both attentions, tied embeddings, frozen parameters, buffers, a
#: parameter on the root module, a module used twice); MLP widths and head counts are
#: multiples of 2 so that a tensor-parallel size of 2 divides them (4 as well for some MLPs).
COVER_MODELS: tuple[ModelSpec, ...] = (
    ModelSpec(hidden=6, blocks=(BlockSpec(ffn=4),), seed=11),
    ModelSpec(
        hidden=6,
        blocks=(BlockSpec(ffn=4, norm=False), BlockSpec("NestedBlock", ffn=4, inner=2)),
        scale=False,
        seed=12,
    ),
    ModelSpec(hidden=6, blocks=(BlockSpec(ffn=8),), vocab=7, out=7, tied=True, seed=13),
    ModelSpec(
        hidden=6,
        blocks=(BlockSpec("NestedBlock", ffn=4, inner=1),),
        frozen=("blocks.0.proj.bias", "inp.weight"),
        seed=14,
    ),
    ModelSpec(
        hidden=6,
        blocks=(BlockSpec("AttentionBlock", ffn=4, attention="hand", heads=2, tokens=3),),
        root_param=True,
        seed=15,
    ),
    ModelSpec(
        hidden=6,
        blocks=(BlockSpec("AttentionBlock", ffn=4, attention="mha", heads=2, tokens=2),),
        vocab=5,
        shared=True,
        scale=False,
        seed=16,
    ),
)

FSDP_WRAPS = ("none", "classes", "module_wrap_policy", "custom_policy", "size", "callable")
MP_CLASS_SETS: tuple[tuple[str, ...], ...] = ((), ("Block",), ("NestedBlock",), ("AttentionBlock",))

Pair = tuple[str, str, str, str]


@dataclass(frozen=True)
class CoverRow:
    """One configuration of the cover: a scenario and the checkpoint format it round-trips."""

    scenario: Scenario
    fmt: str

    @property
    def id(self) -> str:
        """A stable, readable check id part: family, layout, precision, wrap, world, format,
        model."""
        s = self.scenario
        model = COVER_MODELS.index(s.model)
        if isinstance(s.strategy, FSDPConfig):
            mesh = "x".join(map(str, s.strategy.device_mesh)) if s.strategy.device_mesh else ""
            layout = s.strategy.sharding_strategy + (f"({mesh})" if mesh else "")
            wrap = s.strategy.wrap.kind
        else:
            layout = f"dp{s.strategy.data_parallel_size}xtp{s.strategy.tensor_parallel_size}"
            wrap = "+".join(s.strategy.fsdp_classes) or "root"
        return f"{s.family}-{layout}-{s.precision}-{wrap}-w{s.world_size}-{self.fmt}-m{model}"

    def axes(self) -> dict[str, tuple[str, ...]]:
        """The axis values this row takes (as the suites' dispatch reports them)."""
        return scenario_axes(self.scenario, self.fmt)


def _optim(precision: str, index: int) -> OptimSpec:
    if precision == "16-true":  # fp16 Adam's second moment underflows (tolerances.py)
        return OptimSpec(kind="sgd", lr=0.05, eps=1e-4)
    kind = ("adam", "sgd", "adamw")[index % 3]
    return OptimSpec(
        kind=kind,
        lr=0.05 if kind == "sgd" else 0.01,
        eps=1e-4 if precision.startswith("16") else 1e-6,
        weight_decay=0.1 if kind == "adamw" else 0.0,
    )


def _plan(precision: str, index: int) -> TrainPlan:
    """Two steps of two micro-batches (accumulation under ``no_backward_sync``), clipped."""
    return TrainPlan(
        steps=2,
        micro_batches=2,
        clip=0.5,
        batch_size=2 + index % 2,
        data_seed=index,
        loss_scale=1 / 256 if precision == "16-mixed" else 1.0,
    )


def richest_block(model: ModelSpec) -> tuple[str, ...]:
    """The wrap unit class: the model's richest block kind (one class, so units never
    nest)."""
    kinds = {b.kind for b in model.blocks}
    return next((k,) for k in ("AttentionBlock", "NestedBlock", "Block") if k in kinds)


@functools.cache
def _size_threshold(model: ModelSpec) -> int:
    """The smallest ``size`` threshold the suites draw for ``model`` (tied weights in one
    unit, no unit inside a MultiheadAttention: :func:`~suites.lib.controller.scenarios.
    valid_wrap`): it wraps the most units."""
    plain = build_model(model, "meta")
    numels = sorted({sum(p.numel() for p in m.parameters()) for m in plain.modules()})
    return next(n for n in numels if n > 0 and valid_wrap(model, WrapSpec("size", (), n)))


def _fsdp_wrap(kind: str, model: ModelSpec) -> WrapSpec:
    if kind == "none":
        return WrapSpec()
    if kind == "size":
        return WrapSpec("size", min_num_params=_size_threshold(model))
    return WrapSpec(kind, classes=richest_block(model))


def _present(model: ModelSpec) -> set[str]:
    """The block classes ``model`` holds (a shared module is a Block)."""
    return {b.kind for b in model.blocks} | ({"Block"} if model.shared else set())


def _mesh(strategy: str, world: int) -> tuple[int, int] | None:
    """The hybrid mesh of ``world`` ranks (replicas x shard group; both > 1 where possible)."""
    if "HYBRID" not in strategy:
        return None
    for replicas in (2, world):
        if world % replicas == 0 and replicas > 1:
            return (replicas, world // replicas)
    return (1, world)


def _fsdp_candidates(worlds: Sequence[int]) -> Iterator[Scenario]:
    index = 0
    for world in worlds:
        for strategy in SHARDING_STRATEGIES:
            if "HYBRID" in strategy and world < 2:
                continue  # a hybrid mesh of one rank is plain FULL_SHARD
            for precision in FSDP_COVER_PRECISIONS:
                for wrap in FSDP_WRAPS:
                    for model in COVER_MODELS:
                        index += 1
                        yield Scenario(
                            world_size=world,
                            model=model,
                            strategy=FSDPConfig(
                                sharding_strategy=strategy,
                                wrap=_fsdp_wrap(wrap, model),
                                precision=precision,
                                device_mesh=_mesh(strategy, world),
                            ),
                            optim=_optim(precision, index),
                            plan=_plan(precision, index),
                        )


def _mp_candidates(worlds: Sequence[int]) -> Iterator[Scenario]:
    index = 0
    for world in worlds:
        for dp in (d for d in range(1, world + 1) if world % d == 0):
            tp = world // dp
            for precision in MP_PRECISIONS:
                for classes in MP_CLASS_SETS:
                    for model in COVER_MODELS:
                        if any(b.ffn % tp or b.heads % tp for b in model.blocks):
                            continue  # the plan gives each rank whole MLP columns and heads
                        if set(classes) - _present(model):
                            continue
                        index += 1
                        yield Scenario(
                            world_size=world,
                            model=model,
                            strategy=MPConfig(
                                data_parallel_size=dp,
                                tensor_parallel_size=tp,
                                tp_plan="mlp" if tp > 1 else "none",
                                fsdp_classes=classes,
                                reshard_after_forward=index % 2 == 0,
                                precision=precision,
                            ),
                            optim=_optim(precision, index),
                            plan=_plan(precision, index),
                        )


def candidates(worlds: Sequence[int]) -> list[CoverRow]:
    """Every concrete configuration of both families at the world sizes ``worlds``, in each
    checkpoint format."""
    scenarios = [*_fsdp_candidates(worlds), *_mp_candidates(worlds)]
    return [CoverRow(s, fmt) for s in scenarios for fmt in FORMATS]


@functools.cache
def universe(worlds: tuple[int, ...]) -> frozenset[Pair]:
    """Every pair of axis values some valid configuration at ``worlds`` takes (computed once
    per run: every row of the cover declares it)."""
    found: set[Pair] = set()
    for row in candidates(worlds):
        found |= pairs_of(row.axes())
    return frozenset(found)


@functools.cache
def cover_rows(worlds: tuple[int, ...]) -> tuple[CoverRow, ...]:
    """A small set of configurations that together take every pair of :func:`universe`.

    Greedy: each time, the candidate that takes the most pairs not yet taken (the first such
    in enumeration order, so the result is deterministic).
    """
    rows = candidates(worlds)
    pairs = [frozenset(pairs_of(row.axes())) for row in rows]
    missing = set().union(*pairs) if pairs else set()
    chosen: list[CoverRow] = []
    while missing:
        best = max(range(len(rows)), key=lambda i: len(pairs[i] & missing))
        chosen.append(rows[best])
        missing -= pairs[best]
    return tuple(chosen)


def _in_scope(scenario: Scenario, scope: dict[str, tuple[str, ...]]) -> bool:
    axes = scenario_axes(scenario)
    return all(set(axes[axis]) & set(allowed) for axis, allowed in scope.items() if axis in axes)


def value_cover(
    worlds: Sequence[int],
    clause: str,
    keep: Callable[[Scenario], bool] = lambda scenario: True,
) -> tuple[Scenario, ...]:
    """The fewest candidates (greedily, deterministically) that ``keep`` accepts and that
    among them take every value of each axis inside ``clause``'s scope
    (:attr:`harness.clauses.Clause.scope`; the checkpoint format is not an axis here).

    Args:
        worlds: the world sizes the session can run.
        clause: the clause whose check gets the scenarios.
        keep: which candidates the check can run (its own restrictions: a model with frozen
            parameters, a tensor-parallel mesh).

    Raises:
        KeyError: ``clause`` is not one of the contract's clauses.
    """
    scope = {axis: tuple(allowed) for axis, allowed in CLAUSES[clause].scope}
    pool: list[Scenario] = []
    for row in candidates(worlds):
        s = row.scenario
        if row.fmt == FORMATS[0] and _in_scope(s, scope) and keep(s):
            pool.append(s)
    taken = [
        {(axis, value) for axis, values in scenario_axes(s).items() for value in values}
        for s in pool
    ]
    missing = set().union(*taken) if taken else set()
    missing = {(axis, v) for axis, v in missing if axis not in scope or v in scope[axis]}
    chosen: list[Scenario] = []
    while missing:
        best = max(range(len(pool)), key=lambda i: len(taken[i] & missing))
        chosen.append(pool[best])
        missing -= taken[best]
    return tuple(chosen)


def covering_examples(
    clause: str,
    keep: Callable[[Scenario], bool] = lambda scenario: True,
    adapt: Callable[[Scenario], Any] = lambda scenario: scenario,
    *,
    argname: str | None = None,
    share: int = 10,
) -> Callable[[T], T]:
    """Decorate a Hypothesis check of ``clause``: it also runs :func:`value_cover`'s
    scenarios as explicit examples, and draws as many fewer random ones (at least one), so
    its cost stays what its profile gives it.

    Args:
        clause: whose scope the scenarios cover.
        keep: which candidates the check can run.
        adapt: fits a scenario to the check (its plan, activation checkpointing), or makes
            the check's argument of it (a :class:`CkptPlan`).
        argname: the check's argument, by keyword (default: the first, by position).
        share: the check's examples under ``ci`` (as :func:`~suites.lib.controller.
            scenarios.examples`; scaled like the active profile).

    Raises:
        ValueError: ``adapt`` changed a scenario's axis values (the coverage would be wrong).
    """
    values = []
    for s in value_cover(tuple(available_world_sizes()), clause, keep):
        fitted = adapt(s)
        if isinstance(fitted, Scenario) and scenario_axes(fitted) != scenario_axes(s):
            raise ValueError(
                f"covering_examples({clause!r}): adapt changed the axes of a scenario from "
                f"{scenario_axes(s)} to {scenario_axes(fitted)}; it may change only what "
                "the axes do not name (plan, optimizer, activation checkpointing)"
            )
        values.append(fitted)

    def decorate(test: T) -> T:
        for value in reversed(values):
            test = example(**{argname: value})(test) if argname else example(value)(test)
        draws = max(1, share * settings().max_examples // 10 - len(values))
        return settings(max_examples=draws)(test)

    return decorate


def covering_rows(
    clause: str,
    keep: Callable[[Scenario], bool] = lambda scenario: True,
    formats: Sequence[str] = FORMATS,
) -> list[CoverRow]:
    """:func:`value_cover`'s scenarios for ``clause`` at the session's world sizes, each with
    one of ``formats`` in turn (both formats are taken once there are two rows)."""
    worlds = tuple(available_world_sizes())
    return [
        CoverRow(s, formats[i % len(formats)])
        for i, s in enumerate(value_cover(worlds, clause, keep))
    ]


def round_trip_plan(row: CoverRow, requested: tuple[str, ...] = ("counter",)) -> CkptPlan:
    """The checkpoint plan of ``row``: saved and loaded with the row's options, the loading
    side with another init and learning rate (a loader that does nothing is caught), every
    kind of metadata saved and ``requested`` asked back."""
    s = row.scenario
    load = dataclasses.replace(
        s,
        model=dataclasses.replace(s.model, seed=s.model.seed + 1000),
        optim=dataclasses.replace(s.optim, lr=s.optim.lr * 2),
    )
    return CkptPlan(save=s, fmt=row.fmt, load=load, meta=META_KINDS, requested=requested)


def reshard_plan(row: CoverRow) -> CkptPlan | None:
    """:func:`round_trip_plan` of ``row`` loaded at another world size: the largest other
    one the session can run, with the row's options fitted to it (a hybrid mesh of that
    world; model_parallel as data-parallel only, which every width divides). None when the
    session runs one world size only (attach mode)."""
    plan = round_trip_plan(row)
    save = plan.save
    others = [w for w in available_world_sizes() if w != save.world_size]
    if not others:
        return None
    world = max(others)
    config: FSDPConfig | MPConfig
    if isinstance(save.strategy, FSDPConfig):
        strategy = save.strategy.sharding_strategy
        if "HYBRID" in strategy and world < 2:
            strategy = "FULL_SHARD"
        config = dataclasses.replace(
            save.strategy, sharding_strategy=strategy, device_mesh=_mesh(strategy, world)
        )
    else:
        config = dataclasses.replace(
            save.strategy, data_parallel_size=world, tensor_parallel_size=1, tp_plan="none"
        )
    load = dataclasses.replace(plan.load, world_size=world, strategy=config)
    return dataclasses.replace(plan, load=load)


def other_family_plan(row: CoverRow) -> CkptPlan:
    """:func:`round_trip_plan` of ``row`` (a full checkpoint) loaded into the other family at
    the same world size, with that family's plainest options: FULL_SHARD without a policy,
    or data parallel over the whole world with the root as the only ``fully_shard`` unit."""
    plan = round_trip_plan(row)
    save = plan.save
    config: FSDPConfig | MPConfig
    if isinstance(save.strategy, FSDPConfig):
        config = MPConfig(
            data_parallel_size=save.world_size,
            tensor_parallel_size=1,
            tp_plan="none",
            precision=save.precision,
        )
    else:
        config = FSDPConfig(precision=save.precision)
    return dataclasses.replace(plan, load=dataclasses.replace(plan.load, strategy=config))
