"""The cost clauses' rank job (CONTRACT.md MEM-* and COMM-*): one training run, measured.

:func:`cost_rank` builds the scenario's strategy, model and optimizer, runs one warm-up step
(lazy initialization, the optimizer's state created), then one measured step and, when asked,
a save (full or sharded: the strategy is built with that format) and its load, under torch's
instruments (:mod:`suites.lib.ranks.cost_meters`). It also measures
the plain model of the same scenario on this rank (its parameters, gradients, optimizer state
and the peak of one micro-batch's activations), the yardstick every bound is computed from.
The controller turns the record into the clauses' bounds (:mod:`suites.lib.controller.cost`).
"""

from __future__ import annotations

import os

import torch.nn.functional as F

from harness import RankContext
from harness.verdicts.attribution import clause
from suites.lib.ranks.checkpoint_jobs import format_options
from suites.lib.ranks.cost_meters import CommMeter, PeakMeter, held
from suites.lib.ranks.training import Trained, end, micro_step, setup
from suites.lib.shared.arguments import passes, plan_arguments
from suites.lib.shared.cost_record import CostRecord, plain_dtype
from suites.lib.shared.models import build_model, make_batch
from suites.lib.shared.specs import Scenario

__all__ = ["cost_rank"]


def _plain(scenario: Scenario, dp_rank: int) -> dict[str, int]:
    """The plain model's footprint on this rank's micro-batch (see :class:`CostRecord`)."""
    model = build_model(scenario.model, "cpu").to(plain_dtype(scenario.precision))
    optimizer = scenario.optim.build(model.named_parameters())
    plan = scenario.plan
    x, y = make_batch(scenario.model, plan.data_seed, 0, 0, dp_rank, plan.batch_size)
    if x.is_floating_point():
        x = x.to(plain_dtype(scenario.precision))
    with PeakMeter(model, optimizer) as meter:
        meter.next_forward()
        F.mse_loss(model(x).float(), y).backward()
    optimizer.step()
    out = held(model, optimizer)
    return {
        "params": out["params"],
        "buffers": out["buffers"],
        "grads": out["grads"],
        "optimizer": out["optimizer"],
        "activations": meter.peak["activations"] + meter.peak["temporaries"],
    }


def _step(
    t: Trained,
    scenario: Scenario,
    step: int,
    dp_rank: int,
    meter: CommMeter,
    peak: PeakMeter | None = None,
) -> None:
    """The micro-batches of one step, each under its phase of ``meter``."""
    plan = scenario.plan
    for micro in range(plan.micro_batches):
        if peak is not None:
            peak.next_forward()
        accumulate = micro < plan.micro_batches - 1
        with (
            meter.phase("accumulate" if accumulate else "step"),
            clause("SYNC-1"),
            t.strategy.no_backward_sync(t.model, enabled=accumulate),
        ):
            micro_step(t, scenario, step, micro, dp_rank)


def _finish(t: Trained, scenario: Scenario, meter: CommMeter) -> None:
    plan = scenario.plan
    if plan.clip is not None:
        with meter.phase("clip"), clause("CLIP-1"):
            t.strategy.clip_gradients_norm(
                t.model,
                t.optimizer,
                max_norm=plan.clip,
                norm_type=plan.norm_type,
                error_if_nonfinite=plan.error_if_nonfinite,
            )
    with meter.phase("optimizer step"), clause("API-4"):
        t.strategy.optimizer_step(t.optimizer)
    t.optimizer.zero_grad()


def _round_trip(t: Trained, record: CostRecord, directory: str, fmt: str) -> None:
    """Measure a save of the trained state in ``fmt`` and its load back into the same
    objects: a full one's peaks and state-carrying collectives, a sharded one's collectives
    (all of them, and those that carry state); then what the model and optimizer hold."""
    state = {"model": t.model, "optimizer": t.optimizer}
    path = os.path.join(directory, "ckpt.pt" if fmt == "full" else "sharded")
    save, load = CommMeter(), CommMeter()
    with PeakMeter(t.model, t.optimizer) as save_peak, save, save.phase("save"):
        t.strategy.save_checkpoint(path, state)
    with PeakMeter(t.model, t.optimizer) as load_peak, load, load.phase("load"):
        t.strategy.load_checkpoint(path, state)
    record.rest["after a load"] = held(t.model, t.optimizer)
    if fmt == "full":
        record.save_peak, record.load_peak = save_peak.peak, load_peak.peak
        record.save_comm = save.summary(state_only=True).get("save", {})
        record.load_comm = load.summary(state_only=True).get("load", {})
        return
    record.sharded_comm = {**save.summary(), **load.summary()}
    record.sharded_state = {**save.summary(state_only=True), **load.summary(state_only=True)}


@passes(lambda scenario, save_to=None, fmt="full": plan_arguments(scenario))
def cost_rank(
    ctx: RankContext, scenario: Scenario, save_to: str | None = None, fmt: str = "full"
) -> CostRecord:
    """Rank job: measure one scenario's memory and collectives (see the module docstring).

    Args:
        ctx: the harness ``RankContext``.
        scenario: the scenario; its plan's micro-batches, clip and precision are used, its
            step count is not (one warm-up step, one measured).
        save_to: a directory: after the measured step, save a checkpoint of format ``fmt``
            there (the strategy is built with that format's option) and load it back,
            measuring both.
        fmt: ``full`` or ``sharded``.
    """
    overrides = format_options(scenario.family, fmt) if save_to else {}
    t = setup(ctx, scenario, **overrides)
    dp_rank = t.strategy.distributed_sampler_kwargs["rank"]
    record = CostRecord(rank=ctx.rank, plain=_plain(scenario, dp_rank))
    record.rest["after setup"] = held(t.model, t.optimizer)
    warm = CommMeter()
    _step(t, scenario, 0, dp_rank, warm)
    _finish(t, scenario, warm)
    comm = CommMeter()
    with PeakMeter(t.model, t.optimizer) as peak, comm:
        _step(t, scenario, 1, dp_rank, comm, peak)
        record.rest["gradients held"] = held(t.model, t.optimizer)
        _finish(t, scenario, comm)
    record.peak = peak.peak
    record.comm = comm.summary()
    record.rest["after the step"] = held(t.model, t.optimizer)
    if save_to:
        _round_trip(t, record, save_to, fmt)
    end(t.strategy)
    return record
