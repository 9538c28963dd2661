"""Per-clause value covers: each configuration-dependent clause reaches every value of its scope.

The pairwise cover (:mod:`suites.lib.controller.covering`) takes every pair of values, but
only for the clauses its one rank job checks. A clause checked elsewhere reaches only what its
own checks draw, and under the derandomized ``ci`` profile nothing guarantees that a given
value is among them. This module gives each such check, from the same candidates:

- :func:`value_cover`: the fewest configurations the check can run that take, among them,
  every value of each axis inside the clause's scope (:attr:`harness.clauses.Clause.scope`);
- :func:`argument_rows` and :func:`argument_cover`: the values of the contract methods'
  arguments that the scope names and a scenario carries (``norm_type``,
  ``error_if_nonfinite``, ``empty_init``: :data:`~suites.lib.shared.arguments.DRAWN`), every
  one of them on a few cheap configurations of each family;
- :func:`covering_examples`: those configurations as explicit Hypothesis examples, in place
  of as many of the profile's random draws, so the check costs about what it did;
- :func:`covering_rows`: the same as :class:`~suites.lib.controller.covering.CoverRow` values
  with a checkpoint format in turn, for a sibling check of a check that draws inside its body
  (``st.data()``: Hypothesis gives such a check no explicit example);
- :func:`round_trip_plan`, :func:`reshard_plan`, :func:`other_family_plan`: the checkpoint
  plan of a row, loaded with its own options, at another world size, or into the other
  family.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from hypothesis import example, settings

from harness.clauses import CLAUSES, WORD_AXES
from suites.lib.controller.covering import (
    CoverRow,
    candidates,
    hybrid_mesh,
    relative_cost,
    staged_cover,
)
from suites.lib.controller.scenarios import available_world_sizes
from suites.lib.shared.arguments import DRAWN, carried_arguments, with_arguments
from suites.lib.shared.axes import scenario_axes
from suites.lib.shared.checkpoint_specs import FORMATS, META_KINDS, CkptPlan
from suites.lib.shared.specs import FSDP2Config, FSDPConfig, MPConfig, Scenario, StrategyConfig

__all__ = [
    "argument_cover",
    "argument_rows",
    "covering_examples",
    "covering_rows",
    "other_family_plan",
    "reshard_plan",
    "round_trip_plan",
    "value_cover",
    "widest_row",
]

T = TypeVar("T", bound=Callable[..., Any])


def _configuration_axes(scenario: Scenario) -> dict[str, tuple[str, ...]]:
    """``scenario``'s axis values without the contract's words (:mod:`harness.clauses.words`):
    the covers take the values of configurations, the candidates' models meet no word but the
    plain one, and a check's own examples reach the others (an activation-checkpointing
    policy, which an ``adapt`` may add, changes them)."""
    return {axis: v for axis, v in scenario_axes(scenario).items() if axis not in WORD_AXES}


def _in_scope(scenario: Scenario, scope: dict[str, tuple[str, ...]]) -> bool:
    axes = _configuration_axes(scenario)
    return all(set(axes[axis]) & set(allowed) for axis, allowed in scope.items() if axis in axes)


def value_cover(
    worlds: Sequence[int],
    clause: str,
    keep: Callable[[Scenario], bool] = lambda scenario: True,
) -> tuple[Scenario, ...]:
    """A few cheap candidates (:func:`~suites.lib.controller.covering.greedy_cover`) that
    ``keep`` accepts and that among them take every value of each axis inside ``clause``'s
    scope
    (:attr:`harness.clauses.Clause.scope`; the checkpoint format is not an axis here), each
    with a plain plan: one micro-batch per step, no clipping. Clipping and accumulation
    belong to CLIP-1 and SYNC-1 (and the pairwise cover, which draws both): a bug in them
    must not fail another clause's checks.

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
        frozenset(
            (axis, value)
            for axis, values in _configuration_axes(s).items()
            for value in values
            if axis not in scope or value in scope[axis]
        )
        for s in pool
    ]
    chosen = staged_cover(taken, [relative_cost(s) for s in pool], [s.family for s in pool])
    return tuple(_plain(pool[i]) for i in chosen)


def widest_row(
    worlds: Sequence[int],
    clause: str,
    keep: Callable[[Scenario], bool] = lambda scenario: True,
) -> Scenario | None:
    """The cheapest candidate (:func:`~suites.lib.controller.covering.relative_cost`) at the
    largest of ``worlds`` that ``keep`` accepts, inside ``clause``'s scope, with a plain plan
    as :func:`value_cover` gives them; None when there is none.

    Raises:
        KeyError: ``clause`` is not one of the contract's clauses.
    """
    scope = {axis: tuple(allowed) for axis, allowed in CLAUSES[clause].scope}
    top = max(worlds)
    pool = [
        row.scenario
        for row in candidates(worlds)
        if row.fmt == FORMATS[0]
        and row.scenario.world_size == top
        and _in_scope(row.scenario, scope)
        and keep(row.scenario)
    ]
    if not pool:
        return None
    return _plain(min(pool, key=relative_cost))  # min keeps the first of equal costs


def _plain(scenario: Scenario) -> Scenario:
    plan = dataclasses.replace(scenario.plan, micro_batches=1, clip=None)
    return dataclasses.replace(scenario, plan=plan)


def argument_rows(clause: str) -> list[dict[str, str]]:
    """Values of the arguments that ``clause``'s scope names and a scenario carries
    (:data:`~suites.lib.shared.arguments.DRAWN`), one dict per row: as many rows as the
    argument with the most values has, row ``i`` taking value ``i`` (cyclically) of each, so
    that together they take every value of each (none: the scope names no such argument).

    Raises:
        KeyError: ``clause`` is not one of the contract's clauses.
    """
    named = [(axis, allowed) for axis, allowed in CLAUSES[clause].scope if axis in DRAWN]
    if not named:
        return []
    count = max(len(allowed) for _, allowed in named)
    return [{axis: allowed[i % len(allowed)] for axis, allowed in named} for i in range(count)]


def argument_cover(
    worlds: Sequence[int],
    clause: str,
    keep: Callable[[Scenario], bool] = lambda scenario: True,
) -> tuple[Scenario, ...]:
    """Every row of :func:`argument_rows` on a configuration of each family the clause
    speaks of (each family implements the method on its own), families in turn within a
    row. The configurations are the cheapest of :func:`value_cover` among those that split
    parameters over ranks (a reduction across shards is what an argument such as
    ``norm_type`` changes), a different one for each row where there are enough.

    Args:
        worlds: the world sizes the session can run.
        clause: the clause whose scope names the arguments.
        keep: which candidates the check can run.
    """
    rows = argument_rows(clause)
    if not rows:
        return ()
    scope = dict(CLAUSES[clause].scope)
    split = min(2, max(worlds))
    per_family = []
    for family in scope.get("family", ("fsdp", "model_parallel", "fsdp2")):

        def splits(s: Scenario, family: str = family) -> bool:
            return keep(s) and s.family == family and s.shard_factor >= split

        bases = value_cover(worlds, clause, splits)
        if bases:
            per_family.append(sorted(bases, key=relative_cost))
    return tuple(
        with_arguments(bases[i % len(bases)], row)
        for i, row in enumerate(rows)
        for bases in per_family
    )


def _with_rows(scenarios: Sequence[Scenario], rows: list[dict[str, str]]) -> list[Scenario]:
    """``scenarios`` carrying ``rows`` in turn, cycled until both are used up."""
    if not rows or not scenarios:
        return list(scenarios)
    count = max(len(scenarios), len(rows))
    return [
        with_arguments(scenarios[i % len(scenarios)], rows[i % len(rows)]) for i in range(count)
    ]


def covering_examples(
    clause: str,
    keep: Callable[[Scenario], bool] = lambda scenario: True,
    adapt: Callable[[Scenario], Any] = lambda scenario: scenario,
    *,
    argname: str | None = None,
    share: int = 10,
    configurations: bool = True,
    part: Callable[[Scenario], bool] = lambda scenario: True,
    widest: bool = False,
) -> Callable[[T], T]:
    """Decorate a Hypothesis check of ``clause``: it also runs :func:`value_cover`'s
    scenarios, carrying in turn the argument values of :func:`argument_rows`, as explicit
    examples (or, with ``configurations=False``, :func:`argument_cover`'s only: the check of
    a clause whose configurations another check covers), and draws as many fewer random
    ones (at least one), so its cost stays what its profile gives it. The first failing
    example ends the check (``report_multiple_bugs=False``): a strategy that fails them all
    costs one job, and a failure already known elsewhere is not run ten times over.

    Args:
        clause: whose scope the scenarios cover.
        keep: which candidates the check can run.
        adapt: fits a scenario to the check (its plan, activation checkpointing), or makes
            the check's argument of it (a :class:`CkptPlan`).
        argname: the check's argument, by keyword (default: the first, by position).
        share: the check's examples, in tenths of the active profile's (as
            :func:`~suites.lib.controller.scenarios.examples`).
        configurations: cover the values of the scope's configuration axes too.
        part: the scenarios of the cover this check runs, where several checks share the
            clause's one cover (one check a family: each runs its family's rows, and
            together they take every value, in fewer rows than a cover of each family).
        widest: the check also runs at the session's largest world size: where none of its
            rows is there (the cover took that size from another family's row), the
            cheapest candidate of its part there (:func:`widest_row`) is one more example.

    Raises:
        ValueError: ``adapt`` changed a scenario's axis values or the argument values it
            carries (the coverage would be wrong).
    """
    worlds = tuple(available_world_sizes())
    rows = argument_rows(clause)
    if configurations:
        covering = _with_rows(value_cover(worlds, clause, keep), rows)
    else:
        covering = list(argument_cover(worlds, clause, keep))
    drawn = set(rows[0]) if rows else set()

    def passes(scenario: Scenario) -> dict[str, str]:
        return {k: v for k, v in carried_arguments(scenario).items() if k in drawn}

    mine = [s for s in covering if part(s)]
    if widest and all(s.world_size < max(worlds) for s in mine):
        extra = widest_row(worlds, clause, lambda s: keep(s) and part(s))
        if extra is not None:
            mine.append(with_arguments(extra, rows[0]) if rows else extra)
    values = []
    for s in mine:
        fitted = adapt(s)
        if isinstance(fitted, Scenario) and _configuration_axes(fitted) != _configuration_axes(s):
            raise ValueError(
                f"covering_examples({clause!r}): adapt changed the axes of a scenario from "
                f"{_configuration_axes(s)} to {_configuration_axes(fitted)}; it may change only "
                "what the axes do not name (plan, optimizer, activation checkpointing)"
            )
        if isinstance(fitted, Scenario) and passes(fitted) != passes(s):
            raise ValueError(
                f"covering_examples({clause!r}): adapt changed the arguments a scenario "
                f"passes from {passes(s)} to {passes(fitted)}; they are the argument cover's"
            )
        values.append(fitted)

    def decorate(test: T) -> T:
        for value in reversed(values):
            test = example(**{argname: value})(test) if argname else example(value)(test)
        draws = max(1, share * settings().max_examples // 10 - len(values))
        return settings(max_examples=draws, report_multiple_bugs=False)(test)

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
    session runs one world size only (``--nproc 1``, or torchrun with one rank)."""
    plan = round_trip_plan(row)
    save = plan.save
    others = [w for w in available_world_sizes() if w != save.world_size]
    if not others:
        return None
    world = max(others)
    config: StrategyConfig
    if isinstance(save.strategy, FSDP2Config):
        mesh = save.strategy.device_mesh
        config = dataclasses.replace(
            save.strategy,
            reshard_after_forward=True,
            device_mesh=hybrid_mesh("HYBRID_SHARD", world) if mesh and world > 1 else None,
        )
    elif isinstance(save.strategy, FSDPConfig):
        strategy = save.strategy.sharding_strategy
        if "HYBRID" in strategy and world < 2:
            strategy = "FULL_SHARD"
        config = dataclasses.replace(
            save.strategy, sharding_strategy=strategy, device_mesh=hybrid_mesh(strategy, world)
        )
    else:
        config = dataclasses.replace(
            save.strategy, data_parallel_size=world, tensor_parallel_size=1, tp_plan="none"
        )
    load = dataclasses.replace(plan.load, world_size=world, strategy=config)
    return dataclasses.replace(plan, load=load)


def other_family_plan(row: CoverRow) -> CkptPlan:
    """:func:`round_trip_plan` of ``row`` (a full checkpoint) loaded into another family at
    the same world size, with that family's plainest options: FULL_SHARD without a policy
    (from model_parallel and fsdp2), or data parallel over the whole world with the root as
    the only ``fully_shard`` unit (from fsdp)."""
    plan = round_trip_plan(row)
    save = plan.save
    config: StrategyConfig
    if isinstance(save.strategy, FSDP2Config):
        config = FSDPConfig(precision=save.precision)
    elif isinstance(save.strategy, FSDPConfig):
        config = MPConfig(
            data_parallel_size=save.world_size,
            tensor_parallel_size=1,
            tp_plan="none",
            precision=save.precision,
        )
    else:
        config = FSDPConfig(precision=save.precision)
    return dataclasses.replace(plan, load=dataclasses.replace(plan.load, strategy=config))
