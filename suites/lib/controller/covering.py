"""The suites' configuration space as data, and a pairwise covering set of scenarios over it.

A Hypothesis check draws its configurations at random: under the derandomized ``ci`` profile
its few draws are always the same few, and nothing guarantees that they reach a given pair of
values (a NO_SHARD clip, a 16-true sharded checkpoint). This module declares the space
instead:

- :func:`candidates` enumerates concrete scenarios of the three families over the main axes of
  :mod:`suites.lib.shared.axes` (sharding strategy and mesh, precision, wrap kind, world
  size, checkpoint format, and the model zoo's kinds through :data:`COVER_MODELS`), each valid
  as the suites draw them (a hybrid mesh divides the world, tensor-parallel widths divide the
  MLP, 16-true trains with SGD: fp16 Adam's second moment underflows);
- :func:`universe` is every pair of axis values that some candidate takes: the pairs a
  strategy of both families can be asked to support;
- :func:`cover_rows` picks, greedily and deterministically, candidates until every pair of
  the universe is taken by at least one of them (a pairwise covering design), preferring
  those whose rank jobs cost less (:func:`relative_cost`). The suite
  ``suites/test_whole_configuration_space.py`` runs each row in every profile, so the ``ci`` run
  exercises every supported pair by construction, not by luck.
- :mod:`suites.lib.controller.clause_covers` does the same for one clause's own checks, one
  value at a time, from these candidates.

The rows depend only on the world sizes the session can run (``--nproc``, attach mode), so a
row's check id is the same in every run.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from harness.conformance.output.coverage import pairs_of
from suites.lib.controller.scenarios import (
    MP_PRECISIONS,
    SHARDING_STRATEGIES,
    fsdp2_reshards,
    valid_wrap,
)
from suites.lib.shared.axes import scenario_axes
from suites.lib.shared.checkpoint_specs import FORMATS
from suites.lib.shared.models import BlockSpec, ModelSpec, build_model, tp_widths
from suites.lib.shared.specs import (
    FSDP2Config,
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
    "greedy_cover",
    "hybrid_mesh",
    "pairwise_candidates",
    "relative_cost",
    "richest_block",
    "staged_cover",
    "universe",
]

#: precisions of the fsdp family, in the order rows prefer them
FSDP_COVER_PRECISIONS = ("32-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true")

#: the model variants the cover draws from: together they take every model kind of the zoo
#: (plain and nested blocks, both attentions, tied embeddings, frozen parameters, buffers, a
#: parameter on the root module, a module used twice, a BatchNorm's running statistics); MLP
#: widths and head counts are multiples of 2 so that a tensor-parallel size of 2 divides them
#: (4 as well for some MLPs).
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
        blocks=(BlockSpec("AttentionBlock", ffn=4, attention="hand", heads=2, tokens=2),),
        root_param=True,
        frozen=("inp.weight",),
        seed=15,
    ),
    ModelSpec(
        hidden=6,
        blocks=(BlockSpec("AttentionBlock", ffn=4, attention="mha", heads=2, tokens=2),),
        vocab=5,
        out=5,
        tied=True,
        shared=True,
        seed=16,
    ),
    # widths that are multiples of 8 (4 input features): FSDP1 pads every parameter of a
    # flat parameter to 16 bytes, 8 elements in a 16-bit dtype, and a unit of small
    # parameters (the BatchNorm's two of 2, Scale's gate of 1) must stay within the
    # padding test_sharding's SHARD-1 check allows per parameter (ALIGN_SLACK)
    ModelSpec(hidden=8, in_features=4, blocks=(BlockSpec(ffn=8),), running_stats=True, seed=17),
)

FSDP_WRAPS = ("none", "classes", "module_wrap_policy", "custom_policy", "size", "callable")
FSDP2_WRAPS = ("none", "classes", "module_fn", "size")
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
        elif isinstance(s.strategy, FSDP2Config):
            mesh = "x".join(map(str, s.strategy.device_mesh)) if s.strategy.device_mesh else ""
            layout = f"hsdp({mesh})" if mesh else f"raf{s.strategy.reshard_after_forward}"
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


def hybrid_mesh(strategy: str, world: int) -> tuple[int, int] | None:
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
                                device_mesh=hybrid_mesh(strategy, world),
                            ),
                            optim=_optim(precision, index),
                            plan=_plan(precision, index),
                        )


@functools.cache
def _drawable(model: ModelSpec, wrap: WrapSpec) -> bool:
    """:func:`~suites.lib.controller.scenarios.valid_wrap`, once per pair (it builds the
    model)."""
    return valid_wrap(model, wrap)


def _fsdp2_layouts(world: int) -> Iterator[tuple[bool | int, tuple[int, int] | None]]:
    """``(reshard_after_forward, mesh)`` of the fsdp2 family at ``world`` ranks: every
    reshard value on a 1-D mesh, and HSDP (replicas x shard group) where the world splits."""
    for reshard in fsdp2_reshards(world, None):
        yield reshard, None
    mesh = hybrid_mesh("HYBRID_SHARD", world)
    if world > 1 and mesh is not None and mesh[0] > 1:
        yield True, mesh


def _fsdp2_candidates(worlds: Sequence[int]) -> Iterator[Scenario]:
    index = 0
    for world in worlds:
        for reshard, mesh in _fsdp2_layouts(world):
            for precision in FSDP_COVER_PRECISIONS:
                for wrap in FSDP2_WRAPS:
                    for model in COVER_MODELS:
                        index += 1
                        wrap_spec = _fsdp_wrap(wrap, model)
                        if not _drawable(model, wrap_spec):
                            continue
                        yield Scenario(
                            world_size=world,
                            model=model,
                            strategy=FSDP2Config(
                                wrap=wrap_spec,
                                reshard_after_forward=reshard,
                                precision=precision,
                                device_mesh=mesh,
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
                        if any(width % tp for width in tp_widths(model)):
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
    """Every concrete configuration of the three families at the world sizes ``worlds``, in
    each checkpoint format."""
    scenarios = [*_fsdp_candidates(worlds), *_mp_candidates(worlds), *_fsdp2_candidates(worlds)]
    return [CoverRow(s, fmt) for s in scenarios for fmt in FORMATS]


def pairwise_candidates(worlds: Sequence[int]) -> list[CoverRow]:
    """:func:`candidates` the pairwise cover crosses: all but the fsdp2 rows whose
    ``reshard_after_forward`` is an int.

    [Note: reshard to an int in the pairwise cover] An int ``reshard_after_forward`` needs a
    shard dimension it divides strictly (4 ranks here), so each of its pairs takes a row at
    world size 4 (measured on 2 cores: six more rows of 2-4 s each, a run 1.35x the time of
    one without the family). Its clause, FSDP2-2, reaches it with every value of its scope
    (its value cover takes these candidates), and the Hypothesis checks draw it.
    """
    return [
        row
        for row in candidates(worlds)
        if not (
            isinstance(row.scenario.strategy, FSDP2Config)
            and not isinstance(row.scenario.strategy.reshard_after_forward, bool)
        )
    ]


@functools.cache
def universe(worlds: tuple[int, ...]) -> frozenset[Pair]:
    """Every pair of axis values some configuration of :func:`pairwise_candidates` at
    ``worlds`` takes (computed once per run: every row of the cover declares it)."""
    found: set[Pair] = set()
    for row in pairwise_candidates(worlds):
        found |= pairs_of(row.axes())
    return frozenset(found)


def relative_cost(scenario: Scenario) -> float:
    """About what a rank job of ``scenario`` costs, relative to one at world size 1: its
    ranks share the machine's cores, and a model-parallel job (DTensor dispatch, a 2-D mesh
    above all) costs more. Measured on 2 CPU cores, ``ci``: a row of the cover takes
    0.2-0.3 s at world size 1, about 1 s for fsdp at 3-4 ranks, 1.2-1.7 s for
    model_parallel at 2-4 ranks and 3.1 s on a (2, 2) mesh."""
    cost = float(scenario.world_size)
    strategy = scenario.strategy
    if isinstance(strategy, FSDP2Config) and scenario.world_size > 1:
        cost *= 1.5 if strategy.device_mesh is None else 2.0
    if isinstance(strategy, MPConfig) and scenario.world_size > 1:
        cost *= 2.0
        if strategy.data_parallel_size > 1 and strategy.tensor_parallel_size > 1:
            cost *= 1.5
    return cost


def greedy_cover(values: Sequence[frozenset[Any]], costs: Sequence[float]) -> list[int]:
    """Indices of a few of ``values`` (sets) that together take all their elements.

    Greedy: each time, the one that takes the most elements not yet taken per square root
    of its cost (the square root weighs cost without trading one costly set for several
    cheap ones that take the same: measured over the cover's rows, 8% less time than
    counting alone, and one row more); the first such in order on ties, so the result is
    deterministic.
    """
    missing = set().union(*values) if values else set()
    weights = [cost**0.5 for cost in costs]
    chosen: list[int] = []
    while missing:
        best = max(range(len(values)), key=lambda i: len(values[i] & missing) / weights[i])
        chosen.append(best)
        missing -= values[best]
    return chosen


#: the families in the order their rows are chosen (:func:`staged_cover`)
FAMILY_STAGES: tuple[tuple[str, ...], ...] = (("fsdp", "model_parallel"), ("fsdp2",))


def staged_cover(
    values: Sequence[frozenset[Any]], costs: Sequence[float], families: Sequence[str]
) -> list[int]:
    """:func:`greedy_cover` one :data:`FAMILY_STAGES` stage at a time: the candidates of the
    first stage's families take everything they can, then those of the next stage take what
    is left of theirs.

    [Note: a family added later keeps the earlier rows] The rows' ids are check ids, and
    expected-failures files (a Lightning release's) list them: a family added to the space
    must not change which rows the earlier families get. Choosing them first, from their own
    candidates, keeps them exactly as they were; the new family's rows then take its own
    values and every pair that only its configurations reach.
    """
    chosen: list[int] = []
    taken: set[Any] = set()
    for stage in FAMILY_STAGES:
        index = [i for i, family in enumerate(families) if family in stage]
        picked = greedy_cover([values[i] - taken for i in index], [costs[i] for i in index])
        for j in picked:
            chosen.append(index[j])
            taken |= values[index[j]]
    return chosen


@functools.cache
def cover_rows(worlds: tuple[int, ...]) -> tuple[CoverRow, ...]:
    """A small, cheap set of configurations that together take every pair of
    :func:`universe` (:func:`staged_cover` by :func:`relative_cost`), and the cheapest row
    that reshards to an int after forward."""
    rows = pairwise_candidates(worlds)
    pairs = [frozenset(pairs_of(row.axes())) for row in rows]
    costs = [relative_cost(row.scenario) for row in rows]
    chosen = staged_cover(pairs, costs, [row.scenario.family for row in rows])
    # one row resharding to an int, so every clause these rows check reaches that value too
    # (see [Note: reshard to an int in the pairwise cover])
    resharded = [
        row
        for row in candidates(worlds)
        if not isinstance(getattr(row.scenario.strategy, "reshard_after_forward", True), bool)
    ]
    extra = min(resharded, key=lambda row: relative_cost(row.scenario), default=None)
    return tuple(rows[i] for i in chosen) + ((extra,) if extra is not None else ())
