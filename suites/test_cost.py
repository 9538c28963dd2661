"""CONTRACT.md MEM-1, MEM-2, MEM-3, COMM-1, COMM-2 and COMM-3: what sharding is for.

Each configuration of :data:`ROWS` (every family, its sharding layouts, world sizes 1 to 4,
mixed precision) runs one rank job (:func:`~suites.lib.ranks.cost_jobs.cost_rank`): a warm-up
step, then one step measured with torch's ``MemTracker`` and ``CommDebugMode`` and, for the
families whose full save can go through rank 0 on every device, a full save. The six checks
read the same measurement (kept for the session: one job per row, whichever check asks
first) and hold it to the bounds :mod:`suites.lib.controller.cost` computes from the plain
model and the configuration. The models are deep (eight blocks) and narrow-batched, so
parameters outweigh activations and a unit more or less in flight shows.
"""

from __future__ import annotations

import tempfile
from typing import Any

import pytest

from harness.api import unavailable_reason
from harness.refusals import skip_exception
from harness.run.session import current
from suites.lib.controller.cost import NORM_BYTES, Law, law_of, mib, where
from suites.lib.controller.dispatch import run
from suites.lib.ranks.cost_jobs import cost_rank
from suites.lib.shared.cost_record import CostRecord, describe
from suites.lib.shared.models import BlockSpec, ModelSpec
from suites.lib.shared.specs import (
    FSDP2Config,
    FSDPConfig,
    MPConfig,
    OptimSpec,
    Scenario,
    StrategyConfig,
    TrainPlan,
    WrapSpec,
)

MODEL = ModelSpec(
    hidden=32, blocks=tuple(BlockSpec(ffn=64) for _ in range(8)), in_features=32, out=8, scale=False
)
BLOCKS = WrapSpec("classes", classes=("Block",))
PLAN = TrainPlan(steps=2, micro_batches=2, batch_size=4, clip=1.0)
ADAM = OptimSpec(kind="adam", lr=0.01)


def _row(world: int, config: StrategyConfig) -> Scenario:
    return Scenario(world_size=world, model=MODEL, strategy=config, optim=ADAM, plan=PLAN)


def _fsdp(sharding: str, precision: str = "32-true", mesh: Any = None) -> FSDPConfig:
    return FSDPConfig(
        sharding_strategy=sharding, wrap=BLOCKS, precision=precision, device_mesh=mesh
    )


def _fsdp2(reshard: bool | int = True, precision: str = "32-true", mesh: Any = None) -> FSDP2Config:
    return FSDP2Config(
        wrap=BLOCKS, reshard_after_forward=reshard, precision=precision, device_mesh=mesh
    )


def _mp(dp: int, tp: int, precision: str = "32-true") -> MPConfig:
    plan = "mlp" if tp > 1 else "none"
    return MPConfig(
        data_parallel_size=dp, tensor_parallel_size=tp, tp_plan=plan, precision=precision
    )


#: the measured configurations: each family's layouts at world sizes 1-4, mixed precision
ROWS: tuple[Scenario, ...] = (
    *(_row(w, _fsdp("FULL_SHARD")) for w in (1, 2, 3, 4)),
    _row(4, _fsdp("SHARD_GRAD_OP")),
    _row(2, _fsdp("NO_SHARD")),
    _row(4, _fsdp("HYBRID_SHARD", mesh=(2, 2))),
    _row(2, _fsdp("FULL_SHARD", "bf16-mixed")),
    *(_row(w, _fsdp2()) for w in (1, 2, 3, 4)),
    _row(4, _fsdp2(False)),
    _row(4, _fsdp2(2)),
    _row(4, _fsdp2(mesh=(2, 2))),
    _row(2, _fsdp2(precision="bf16-mixed")),
    *(_row(w, _mp(w, 1)) for w in (1, 2, 3, 4)),
    _row(4, _mp(2, 2)),
    _row(2, _mp(2, 1, "bf16-mixed")),
)
#: the families whose full save MEM-3 measures (see its scope in CONTRACT.md)
SAVES = ("fsdp2", "model_parallel")

_measured: dict[tuple[str, Scenario], list[CostRecord]] = {}


def _id(scenario: Scenario) -> str:
    config = scenario.strategy
    if isinstance(config, FSDPConfig):
        layout = config.sharding_strategy.lower() + (
            f"-{config.device_mesh}" if config.device_mesh else ""
        )
    elif isinstance(config, FSDP2Config):
        layout = f"raf-{config.reshard_after_forward}".lower()
        layout += f"-hsdp{config.device_mesh}" if config.device_mesh else ""
    else:
        assert isinstance(config, MPConfig)
        layout = f"dp{config.data_parallel_size}xtp{config.tensor_parallel_size}"
    return f"{scenario.family}-{layout}-{scenario.precision}-w{scenario.world_size}".replace(
        " ", ""
    )


def _rows(families: tuple[str, ...] = ("fsdp", "fsdp2", "model_parallel")) -> Any:
    return pytest.mark.parametrize(
        "scenario",
        [r for r in ROWS if r.family in families],
        ids=[_id(r) for r in ROWS if r.family in families],
    )


def measure(scenario: Scenario) -> tuple[list[CostRecord], list[Law]]:
    """Every rank's record of ``scenario`` (one rank job per row and strategy in a session)
    and each rank's bounds; a world size this run cannot hold reads ``environment``."""
    __tracebackhide__ = True
    reason = unavailable_reason(scenario.world_size)
    if reason is not None:
        raise skip_exception(reason)
    session = current()
    key = (session.config.strategy, scenario)
    if key not in _measured:
        with tempfile.TemporaryDirectory(dir=session.config.shared_dir) as directory:
            save_to = directory if scenario.family in SAVES else None
            records = run(cost_rank, scenario, save_to, world_size=scenario.world_size)
        _measured[key] = records
        session.note_cost(
            {
                "configuration": where(scenario),
                "family": scenario.family,
                "world_size": scenario.world_size,
                "ranks": [describe(r) for r in records],
            }
        )
    records = _measured[key]
    return records, [law_of(scenario, r) for r in records]


def _at(clause: str, record: CostRecord, scenario: Scenario) -> str:
    """A failure's opening: the clause, then where it was seen (the headline puts what
    is wrong first, and findings group across ranks and configurations)."""
    return f"{clause}: rank {record.rank}, {where(scenario)}: "


@pytest.mark.clause("MEM-1")
@_rows()
def test_each_rank_holds_its_share_at_rest(scenario: Scenario) -> None:
    records, laws = measure(scenario)
    for record, law in zip(records, laws, strict=True):
        for moment, held in record.rest.items():
            for category, label in (
                ("params", "parameters"),
                ("grads", "gradients"),
                ("optimizer", "optimizer state"),
            ):
                share = law.share(category)
                assert held[category] <= share, _at("MEM-1", record, scenario) + (
                    f"holds {mib(held[category])} of {label} {moment} where its share is "
                    f"{mib(share)} (the plain model's {mib(getattr(law, category))} over "
                    f"{law.shard} rank(s), padding included)"
                )


@pytest.mark.clause("MEM-2")
@_rows()
def test_a_step_peaks_within_its_share_and_what_is_in_flight(scenario: Scenario) -> None:
    records, laws = measure(scenario)
    for record, law in zip(records, laws, strict=True):
        bound = law.peak_bound()
        peak = record.peak["total"]
        assert peak <= bound, _at("MEM-2", record, scenario) + (
            f"peaks at {mib(peak)} during a training step where its configuration allows "
            f"{mib(bound)} (its share, {mib(law.in_flight_params())} of unsharded parameters "
            f"and {mib(law.in_flight_grads())} of unsharded gradients in flight, collective "
            f"buffers and activations; {mib(record.peak['params'])} of parameters at the peak)"
        )


@pytest.mark.clause("MEM-3")
@_rows(SAVES)
def test_a_full_save_goes_through_rank_0(scenario: Scenario) -> None:
    records, laws = measure(scenario)
    for record, law in zip(records, laws, strict=True):
        bound = law.save_bound(record.rank)
        peak = record.save_peak["total"]
        whole = "the whole state once, " if record.rank == 0 else ""
        assert peak <= bound, _at("MEM-3", record, scenario) + (
            f"peaks at {mib(peak)} during a full save_checkpoint where its configuration "
            f"allows {mib(bound)} (its share, {whole}one largest unit's parameters and "
            "optimizer state in flight)"
        )


@pytest.mark.clause("COMM-1")
@_rows()
def test_a_synchronized_micro_batch_issues_its_configurations_collectives(
    scenario: Scenario,
) -> None:
    records, laws = measure(scenario)
    tp = scenario.strategy.tensor_parallel_size if isinstance(scenario.strategy, MPConfig) else 1
    for record, law in zip(records, laws, strict=True):
        step = record.comm.get("step", {})
        gathered = sum(step.get("all_gather", []))
        floor, ceiling = law.gather_floor() // tp, law.gather_ceiling()
        at = _at("COMM-1", record, scenario)
        assert gathered >= floor, at + (
            f"a synchronized micro-batch all-gathered {mib(gathered)} of parameters where "
            f"resharding after forward gathers at least {mib(floor)} (every unit in forward "
            "and again in backward): the units stayed gathered between forward and backward"
        )
        assert gathered <= ceiling, at + (
            f"a synchronized micro-batch all-gathered {mib(gathered)} where at most "
            f"{mib(ceiling)} (every parameter twice) is needed"
        )
        for kind in ("reduce_scatter", "all_reduce"):
            if kind == "all_reduce" and isinstance(scenario.strategy, MPConfig):
                continue  # tensor parallelism's activation all-reduces
            moved = sum(step.get(kind, []))
            assert moved <= law.reduce_ceiling(), at + (
                f"a synchronized micro-batch moved {mib(moved)} of gradients by {kind} where "
                f"the plain model's gradients are {mib(law.grads)}: reduced more than once"
            )


@pytest.mark.clause("COMM-2")
@_rows()
def test_clipping_reduces_norms_not_gradients(scenario: Scenario) -> None:
    records, laws = measure(scenario)
    for record, law in zip(records, laws, strict=True):
        limit = NORM_BYTES * law.tensors
        for kind, sizes in record.comm.get("clip", {}).items():
            assert max(sizes) <= limit, _at("COMM-2", record, scenario) + (
                f"clip_gradients_norm {kind.replace('_', '-')}ed {mib(sum(sizes))} in "
                f"{len(sizes)} collective(s), the largest {mib(max(sizes))}, where norms take "
                f"at most {mib(limit)} ({NORM_BYTES} bytes for each of {law.tensors} parameter "
                f"tensors; the gradients are {mib(law.grads)})"
            )


@pytest.mark.clause("COMM-3")
@_rows()
def test_no_backward_sync_moves_no_gradient(scenario: Scenario) -> None:
    records, _ = measure(scenario)
    tp = isinstance(scenario.strategy, MPConfig) and scenario.strategy.tensor_parallel_size > 1
    for record in records:
        inside = record.comm.get("accumulate", {})
        scattered = inside.get("reduce_scatter", [])
        at = _at("COMM-3", record, scenario)
        assert not scattered, at + (
            f"reduce-scattered {mib(sum(scattered))} of gradients in {len(scattered)} "
            "collective(s) inside no_backward_sync(enabled=True)"
        )
        reduced = sum(inside.get("all_reduce", []))
        allowed = sum(record.comm.get("step", {}).get("all_reduce", [])) if tp else 0
        assert reduced <= allowed, at + (
            f"all-reduced {mib(reduced)} inside no_backward_sync(enabled=True) where "
            f"{mib(allowed)} (tensor parallelism's activations) may move"
        )
