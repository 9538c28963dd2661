"""The cost clauses' verdicts (CONTRACT.md MEM-* and COMM-*): a measured configuration held to
its bounds.

:func:`measure` runs the cost rank job of a configuration once per session and strategy (the
nine checks of a configuration read the same measurement) and hands it to the report;
each ``assert_*`` function holds every rank's record to one clause's bounds
(:mod:`suites.lib.controller.cost`) and words a failure as a cost: ``CLAUSE: rank N,
<configuration> at world size N: <who held or moved what> where <the bound>``.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable

import torch

from harness.api import unavailable_reason
from harness.refusals import skip_exception
from harness.run.session import current
from harness.torch_compat import memory_tracker
from suites.lib.controller.cost import NORM_BYTES, Law, law_of, mib, where
from suites.lib.controller.dispatch import run
from suites.lib.shared.cost_record import CostRecord, describe
from suites.lib.shared.specs import MPConfig, Scenario

__all__ = [
    "SHARDED_SAVES",
    "assert_accumulation_collectives",
    "assert_clip_collectives",
    "assert_full_load",
    "assert_full_save",
    "assert_held_at_rest",
    "assert_save_collectives",
    "assert_sharded_collectives",
    "assert_step_peak",
    "assert_synchronized_collectives",
    "measure",
]

#: the families whose sharded save and load COMM-5 measures (see its scope in CONTRACT.md)
SHARDED_SAVES = ("fsdp2", "model_parallel")

_measured: dict[tuple[str, Scenario, str], list[CostRecord]] = {}


def measure(
    scenario: Scenario, job: Callable[..., CostRecord], fmt: str = "full"
) -> tuple[list[CostRecord], list[Law]]:
    """Every rank's record of ``scenario`` by the rank ``job`` (the suite's cost job; one
    rank job per configuration and strategy in a session), its save and load in checkpoint
    format ``fmt`` (``full`` or ``sharded``, the same for every check of ``scenario``), and
    each rank's bounds; a world size this run cannot hold reads ``environment``."""
    __tracebackhide__ = True
    reason = unavailable_reason(scenario.world_size)
    if reason is not None:
        raise skip_exception(reason)
    if memory_tracker() is None:
        raise skip_exception(
            f"environment: torch {torch.__version__} has no "
            "torch.distributed._tools.mem_tracker.MemTracker, the instrument the memory "
            "clauses measure with; run them with a torch that has it (2.13)"
        )
    session = current()
    key = (session.config.strategy, scenario, fmt)  # a format measures its own round trip
    if key not in _measured:
        with tempfile.TemporaryDirectory(dir=session.config.shared_dir) as directory:
            records = run(job, scenario, directory, fmt, world_size=scenario.world_size)
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


def assert_held_at_rest(scenario: Scenario, records: list[CostRecord], laws: list[Law]) -> None:
    """MEM-1: its share at rest, by moment and category."""
    __tracebackhide__ = True
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


def assert_step_peak(scenario: Scenario, records: list[CostRecord], laws: list[Law]) -> None:
    """MEM-2: the step's peak within its share and what is in flight."""
    __tracebackhide__ = True
    for record, law in zip(records, laws, strict=True):
        bound = law.peak_bound()
        peak = record.peak["total"]
        assert peak <= bound, _at("MEM-2", record, scenario) + (
            f"peaks at {mib(peak)} during a training step where its configuration allows "
            f"{mib(bound)} (its share, {mib(law.in_flight_params())} of unsharded parameters "
            f"and {mib(law.in_flight_grads())} of unsharded gradients in flight, collective "
            f"buffers and activations; {mib(record.peak['params'])} of parameters at the peak)"
        )


def assert_full_save(scenario: Scenario, records: list[CostRecord], laws: list[Law]) -> None:
    """MEM-3: a full save's peak: the share, one unit, and on rank 0 the whole state once."""
    __tracebackhide__ = True
    for record, law in zip(records, laws, strict=True):
        bound = law.save_bound(record.rank)
        peak = record.save_peak["total"]
        whole = "the whole state once, " if record.rank == 0 else ""
        assert peak <= bound, _at("MEM-3", record, scenario) + (
            f"peaks at {mib(peak)} during a full save_checkpoint where its configuration "
            f"allows {mib(bound)} (its share, {whole}one largest unit's parameters and "
            "optimizer state in flight)"
        )


def assert_full_load(scenario: Scenario, records: list[CostRecord], laws: list[Law]) -> None:
    """MEM-4: a full load's peak: the share twice, the saved state once, one unit."""
    __tracebackhide__ = True
    for record, law in zip(records, laws, strict=True):
        bound = law.load_bound()
        peak = record.load_peak["total"]
        assert peak <= bound, _at("MEM-4", record, scenario) + (
            f"peaks at {mib(peak)} while a full load_checkpoint reads "
            f"{mib(law.params + law.optimizer)} of saved state where its configuration allows "
            f"{mib(bound)} (its share twice, the saved state once, one largest unit's "
            "parameters and optimizer state)"
        )


def assert_save_collectives(scenario: Scenario, records: list[CostRecord], laws: list[Law]) -> None:
    """COMM-4: a full save gathers each tensor once (per mesh dimension it is sharded on)."""
    __tracebackhide__ = True
    tp = scenario.strategy.tensor_parallel_size if isinstance(scenario.strategy, MPConfig) else 1
    for record, law in zip(records, laws, strict=True):
        gathered = record.save_comm.get("all_gather", [])
        ceiling = law.save_gather_ceiling(tp)
        assert sum(gathered) <= ceiling, _at("COMM-4", record, scenario) + (
            f"all-gathered {mib(sum(gathered))} in {len(gathered)} collective(s) during a full "
            f"save_checkpoint where gathering each tensor once moves at most {mib(ceiling)} "
            f"(the plain model's {mib(law.params)} of parameters and {mib(law.optimizer)} of "
            "optimizer state, padding and metadata)"
        )


def assert_sharded_collectives(
    scenario: Scenario, records: list[CostRecord], laws: list[Law]
) -> None:
    """COMM-5: a sharded save and its load move metadata between ranks, never state."""
    __tracebackhide__ = True
    del laws
    for record in records:
        for what in ("save", "load"):
            moved = record.sharded_state.get(what, {})
            assert not moved, _at("COMM-5", record, scenario) + (
                f"a sharded {what}_checkpoint moved "
                + " and ".join(
                    f"{mib(sum(sizes))} of state by {len(sizes)} {kind.replace('_', '-')}(s)"
                    for kind, sizes in sorted(moved.items())
                )
                + " where each rank writes and reads its own shards and only metadata "
                "(byte tensors) crosses ranks"
            )


def assert_synchronized_collectives(
    scenario: Scenario, records: list[CostRecord], laws: list[Law]
) -> None:
    """COMM-1: the synchronized micro-batch's gathers and reductions."""
    __tracebackhide__ = True
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


def assert_clip_collectives(scenario: Scenario, records: list[CostRecord], laws: list[Law]) -> None:
    """COMM-2: clipping moves norms, not gradients."""
    __tracebackhide__ = True
    for record, law in zip(records, laws, strict=True):
        limit = NORM_BYTES * law.tensors
        for kind, sizes in record.comm.get("clip", {}).items():
            assert max(sizes) <= limit, _at("COMM-2", record, scenario) + (
                f"clip_gradients_norm {kind.replace('_', '-')}ed {mib(sum(sizes))} in "
                f"{len(sizes)} collective(s), the largest {mib(max(sizes))}, where norms take "
                f"at most {mib(limit)} ({NORM_BYTES} bytes for each of {law.tensors} parameter "
                f"tensors; the gradients are {mib(law.grads)})"
            )


def assert_accumulation_collectives(
    scenario: Scenario, records: list[CostRecord], laws: list[Law]
) -> None:
    """COMM-3: no gradient moves inside no_backward_sync."""
    __tracebackhide__ = True
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
        per_micro = sum(record.comm.get("step", {}).get("all_reduce", [])) if tp else 0
        allowed = per_micro * (scenario.plan.micro_batches - 1)
        assert reduced <= allowed, at + (
            f"all-reduced {mib(reduced)} inside no_backward_sync(enabled=True) where "
            f"{mib(allowed)} (tensor parallelism's activations, as many as the synchronized "
            "micro-batch's for each micro-batch inside) may move"
        )
