"""Rank side of the resume check (``test_checkpoint_resume.py``: CKPT-RT-5, MP-3): replay one
segment of the resume machine.

A :class:`Segment` is what one strategy instance does: set up (fresh init, or fresh objects
loaded from ``source``), then its steps and saves so far. The ranks keep nothing between
jobs, so every rule of the machine sends its segment again (:func:`segment_rank`). The
segment and its ops are drawn in the controller and travel to the ranks as data.

Every segment trains under a warmup scheduler
(:func:`~suites.lib.shared.lr_schedules.make_scheduler`) built over its optimizer before
anything else, stepped after each optimizer step and saved with model and optimizer under
``SCHEDULER_KEY``; a resumed segment asks for it back into its fresh scheduler. The job
returns the learning rates it went through, for the controller to hold against the
uninterrupted run's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from suites.lib.ranks.checkpoint_jobs import build
from suites.lib.ranks.readers import gathered_state
from suites.lib.ranks.training import end, micro_step
from suites.lib.shared.lr_schedules import SCHEDULER_KEY, make_scheduler, read_scheduler
from suites.lib.shared.session_ops import Step
from suites.lib.shared.specs import Scenario

__all__ = ["Save", "Segment", "segment_rank"]


@dataclass(frozen=True)
class Save:
    """Save model and optimizer to ``path``."""

    path: str


@dataclass
class Segment:
    """What one strategy instance does: set up (and load ``source``), then ``ops``."""

    scenario: Scenario
    fmt: str
    source: str | None = None
    ops: list[Step | Save] = field(default_factory=list)


def _take_step(t: Any, scenario: Scenario, step: Step, dp_rank: int) -> None:
    plan = dataclasses.replace(scenario.plan, micro_batches=step.micro)
    sc = dataclasses.replace(scenario, plan=plan)
    for micro in range(step.micro):
        with t.strategy.no_backward_sync(t.model, enabled=micro < step.micro - 1):
            micro_step(t, sc, step.index, micro, dp_rank)
    if step.clip is not None:
        t.strategy.clip_gradients_norm(t.model, t.optimizer, max_norm=step.clip)
    t.strategy.optimizer_step(t.optimizer)
    t.optimizer.zero_grad()


def segment_rank(ctx: Any, segment: Segment) -> dict[str, Any]:
    """Replay ``segment`` on this rank.

    Returns:
        ``state``: the gathered parameters at the end; ``lrs``: the scheduler's reading
        (:func:`~suites.lib.shared.lr_schedules.read_scheduler`) after the set-up (and the
        load) and after each step, the first with the scheduler's ``state_dict()``.
    """
    t = build(ctx, segment.scenario, segment.fmt)
    scheduler = make_scheduler(t.optimizer)
    objects = {"model": t.model, "optimizer": t.optimizer, SCHEDULER_KEY: scheduler}
    if segment.source is not None:
        t.strategy.load_checkpoint(segment.source, dict(objects))
    lrs = [read_scheduler(scheduler)]
    dp_rank = t.strategy.distributed_sampler_kwargs["rank"]
    for op in segment.ops:
        if isinstance(op, Step):
            _take_step(t, segment.scenario, op, dp_rank)
            scheduler.step()
            lrs.append({k: v for k, v in read_scheduler(scheduler).items() if k != "state"})
        else:
            t.strategy.save_checkpoint(op.path, dict(objects))
    state = gathered_state(t.model)
    end(t.strategy)
    return {"state": state, "lrs": lrs}
