"""Rank side of the round trip at every moment a recipe saves (``test_checkpoint_roundtrip.py``:
CKPT-RT-1/2 at the moments of :data:`suites.lib.shared.axes.MOMENTS`).

One job saves the same objects three times: before the first optimizer step (the optimizer
has no state; a recipe validating its checkpointing at step 0), after one step (a second
save of the same objects, after more training) and between the two micro-batches of the
second step (gradients accumulated, the step not taken). It then loads each save into fresh
objects and reads them, and loads the save after step 1 once more into fresh objects that
ran a forward and a backward first (their optimizer never stepped, their parameters hold
gradients: a recipe that resumes after a first micro-batch, the sequence where torch's
``set_optimizer_state_dict`` skips initializing the state it loads into, pytorch#140898).
The optimizer's state is looked at locally (``not optimizer.state`` on every rank) where the
save came before the first step: torch's gathered reader would create that state itself. The
controller compares the reads with each other bitwise and the live run with the plain twin
(:func:`suites.lib.controller.checkpoint_checks.check_moments`).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from suites.lib.ranks.checkpoint_jobs import (
    build,
    copy_buffers,
    never_stepped,
    path_for,
    read_state,
)
from suites.lib.ranks.readers import gathered_state
from suites.lib.ranks.training import Trained, end, hold_gradients, micro_step
from suites.lib.shared.checkpoint_specs import CkptPlan
from suites.lib.shared.models import build_model

__all__ = ["moments_rank"]


def _step(t: Trained, plan: CkptPlan, index: int, micro: int, save: str | None = None) -> None:
    """Optimizer step ``index`` of ``micro`` micro-batches (accumulated under
    ``no_backward_sync``); with ``save``, a save there after the first micro-batch."""
    scenario = plan.save
    sc = dataclasses.replace(scenario, plan=dataclasses.replace(scenario.plan, micro_batches=micro))
    dp_rank = t.strategy.distributed_sampler_kwargs["rank"]
    for m in range(micro):
        with t.strategy.no_backward_sync(t.model, enabled=m < micro - 1):
            micro_step(t, sc, index, m, dp_rank)
        if m == 0 and save is not None:
            t.strategy.save_checkpoint(save, {"model": t.model, "optimizer": t.optimizer})
    t.strategy.optimizer_step(t.optimizer)
    t.optimizer.zero_grad()


def _groups(t: Trained) -> list[dict[str, Any]]:
    """The optimizer's groups' hyper-parameters, read locally (no collective, no state)."""
    return [{k: v for k, v in g.items() if k != "params"} for g in t.optimizer.param_groups]


def moments_rank(ctx: Any, plan: CkptPlan, directory: str) -> dict[str, Any]:
    """Rank job: save ``plan.save``'s objects at each moment, load each save into fresh
    objects of ``plan.load`` (same options, another seed and learning rate) and train on.

    Returns:
        ``zero``: at the first save, the live optimizer still without state (``empty``),
        the gathered model and the groups; ``zero_loaded``: the same of fresh objects that
        loaded it, and ``then`` their read after step 1; ``one``/``two``: the live objects'
        reads after steps 1 and 2; ``mid_loaded``: fresh objects that loaded the save made
        inside step 2, and ``then`` after they took step 2 themselves; ``second_loaded``:
        those objects after loading the save made after step 1; ``pending_loaded``: fresh
        objects that ran a micro-batch's forward and backward (gradients held, no step) and
        then loaded the save made after step 1 (``empty``: their optimizer without state right
        after the load), read once the recipe dropped those gradients, and ``then`` after
        they took step 2.
    """
    paths = {m: path_for(os.path.join(directory, m), plan.fmt) for m in ("zero", "one", "mid")}
    t = build(ctx, plan.save, plan.fmt)
    t.strategy.save_checkpoint(paths["zero"], {"model": t.model, "optimizer": t.optimizer})
    out: dict[str, Any] = {
        "zero": {
            "empty": never_stepped(t.optimizer),
            "model": gathered_state(t.model),
            "groups": _groups(t),
        }
    }
    _step(t, plan, 0, 1)
    out["one"] = read_state(t)
    t.strategy.save_checkpoint(paths["one"], {"model": t.model, "optimizer": t.optimizer})
    _step(t, plan, 1, 2, save=paths["mid"])
    out["two"] = read_state(t)
    plain = build_model(plan.load.model, "meta")
    volatile = set(dict(plain.named_buffers())) - set(plain.state_dict())

    f = build(ctx, plan.load, plan.fmt)
    copy_buffers(f.model, t.model, volatile)  # not saved by design: align them to step on
    f.strategy.load_checkpoint(paths["zero"], {"model": f.model, "optimizer": f.optimizer})
    out["zero_loaded"] = {
        "empty": never_stepped(f.optimizer),
        "model": gathered_state(f.model),
        "groups": _groups(f),
    }
    _step(f, plan, 0, 1)
    out["zero_loaded"]["then"] = read_state(f)

    g = build(ctx, plan.load, plan.fmt)
    copy_buffers(g.model, t.model, volatile)
    g.strategy.load_checkpoint(paths["mid"], {"model": g.model, "optimizer": g.optimizer})
    out["mid_loaded"] = read_state(g)
    _step(g, plan, 1, 2)
    out["mid_loaded"]["then"] = read_state(g)
    g.strategy.load_checkpoint(paths["one"], {"model": g.model, "optimizer": g.optimizer})
    out["second_loaded"] = read_state(g)

    h = build(ctx, plan.load, plan.fmt)
    copy_buffers(h.model, t.model, volatile)
    hold_gradients(h, plan.save, h.strategy.distributed_sampler_kwargs["rank"])
    h.strategy.load_checkpoint(paths["one"], {"model": h.model, "optimizer": h.optimizer})
    empty = never_stepped(h.optimizer)
    h.model.zero_grad()  # the recipe's next step starts from no gradients
    out["pending_loaded"] = {**read_state(h), "empty": empty}
    _step(h, plan, 1, 2)
    out["pending_loaded"]["then"] = read_state(h)
    end(t.strategy, f.strategy, g.strategy, h.strategy)
    return out
