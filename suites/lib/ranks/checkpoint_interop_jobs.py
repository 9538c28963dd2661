"""Rank side of the checkpoint interoperation checks: a plain torch checkpoint loaded into
the strategy and the trainer layout with two optimizers (``test_checkpoint_interop.py``:
CKPT-REKEY-1, CKPT-TRAINER-1), and a list of optimizers in the sharded format and the full
file converted from it (``test_checkpoint_optimizer_lists.py``: CKPT-TRAINER-1, CKPT-RT-2,
CKPT-RT-4).

Two optimizers come from :func:`suites.lib.ranks.checkpoint_jobs.build_with_two_optimizers`
(the blocks / the rest); the state is read with torch's own APIs (:func:`_read_all`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from harness import Strategy
from suites.lib.ranks.checkpoint_jobs import attempt, build, build_with_two_optimizers, read_state
from suites.lib.ranks.readers import gathered_optim_state, gathered_state
from suites.lib.ranks.training import end
from suites.lib.shared.checkpoint_specs import CkptPlan
from suites.lib.shared.files import files_digest
from suites.lib.shared.models import make_batch
from suites.lib.shared.specs import Scenario

__all__ = [
    "LIST_KEY",
    "full_list_rank",
    "load_plain_rank",
    "sharded_list_rank",
    "trainer_load_rank",
    "trainer_save_rank",
]


# --- plain torch and the trainer layout (test_checkpoint_interop.py) ----------------------


def load_plain_rank(ctx: Any, plan: CkptPlan, path: str, layout: str) -> dict[str, Any]:
    f = build(ctx, plan.load, "full")
    keys = ("model", "optimizer") if layout == "plain" else ("state_dict", "optimizer_states")
    optimizer: Any = f.optimizer if layout == "plain" else [f.optimizer]
    f.strategy.load_checkpoint(path, {keys[0]: f.model, keys[1]: optimizer})
    out = read_state(f)
    end(f.strategy)
    return out


def _read_all(model: Any, optimizers: list[Any]) -> dict[str, Any]:
    return {
        "model": gathered_state(model),
        "optims": [gathered_optim_state(model, o) for o in optimizers],
    }


def trainer_save_rank(ctx: Any, plan: CkptPlan, path: str) -> dict[str, Any]:
    """Train ``plan.save`` with two optimizers and save the trainer layout (the plan, not
    its scenario, goes to the ranks: the run's coverage then records the format)."""
    scenario = plan.save
    strategy, model, optimizers = build_with_two_optimizers(ctx, scenario)
    dp_rank, train = strategy.distributed_sampler_kwargs["rank"], scenario.plan
    for step in range(train.steps):
        x, y = make_batch(scenario.model, train.data_seed, step, 0, dp_rank, train.batch_size)
        with strategy.precision.forward_context():
            out = model(strategy.precision.convert_input(x.to(strategy.root_device)))
        loss = torch.nn.functional.mse_loss(out.float(), y.to(out.device))
        strategy.backward(loss, model)
        for o in optimizers:
            strategy.optimizer_step(o)
            o.zero_grad()
    state = {"state_dict": model, "optimizer_states": optimizers, "epoch": 2, "global_step": 9}
    strategy.save_checkpoint(path, state)
    out = _read_all(model, optimizers)
    end(strategy)
    return out


def trainer_load_rank(ctx: Any, plan: CkptPlan, path: str) -> dict[str, Any]:
    scenario = plan.load
    strategy, model, optimizers = build_with_two_optimizers(ctx, scenario)
    before = files_digest(path)
    try:
        strategy.load_checkpoint(path, {"state_dict": model, "optimizer_states": optimizers[:1]})
        refused = None
    except RuntimeError as exc:
        refused = str(exc)
    unchanged = files_digest(path) == before
    state: dict[str, Any] = {"state_dict": model, "optimizer_states": optimizers, "epoch": 0}
    strategy.load_checkpoint(path, state)
    out = {
        **_read_all(model, optimizers),
        "refused": refused,
        "unchanged": unchanged,
        "epoch": state["epoch"],
    }
    end(strategy)
    return out


# --- a list of optimizers, sharded (test_checkpoint_optimizer_lists.py) ------------------

#: the trainer's key for a list of optimizers (CKPT-TRAINER-1)
LIST_KEY = "optimizer_states"


def _train(strategy: Strategy, model: Any, optimizers: list[Any], scenario: Scenario) -> None:
    """``scenario.plan.steps`` steps, one micro-batch each, every optimizer stepping."""
    dp_rank, plan = strategy.distributed_sampler_kwargs["rank"], scenario.plan
    device = strategy.root_device
    for step in range(plan.steps):
        x, y = make_batch(scenario.model, plan.data_seed, step, 0, dp_rank, plan.batch_size)
        with strategy.precision.forward_context():
            out = model(strategy.precision.convert_input(x.to(device)))
        strategy.backward(F.mse_loss(out.float(), y.to(device)), model)
        for optimizer in optimizers:
            strategy.optimizer_step(optimizer)
            optimizer.zero_grad()


def sharded_list_rank(ctx: Any, plan: CkptPlan, path: str) -> dict[str, Any]:
    """Train and save a list of two optimizers sharded; load it back, one too few first."""
    strategy, model, optimizers = build_with_two_optimizers(
        ctx, plan.save, "sharded", plan.save.empty_init
    )
    _train(strategy, model, optimizers, plan.save)
    strategy.save_checkpoint(path, {"model": model, LIST_KEY: optimizers, "epoch": 2})
    saved = _read_all(model, optimizers)  # after the save, like the other round trips

    fresh, f_model, f_optims = build_with_two_optimizers(
        ctx, plan.load, "sharded", plan.load.empty_init
    )
    refused = attempt(
        lambda: fresh.load_checkpoint(path, {"model": f_model, LIST_KEY: f_optims[:1]}), path
    )
    state: dict[str, Any] = {"model": f_model, LIST_KEY: f_optims, "epoch": 0}
    returned = fresh.load_checkpoint(path, state)
    out = {
        "saved": saved,
        "loaded": {**_read_all(f_model, f_optims), "epoch": state["epoch"]},
        "refused": refused,
        "returned": dict(returned or {}),
    }
    end(strategy)
    end(fresh)
    return out


def full_list_rank(ctx: Any, plan: CkptPlan, path: str) -> dict[str, Any]:
    """Load the converted full file into fresh objects with two optimizers."""
    strategy, model, optimizers = build_with_two_optimizers(
        ctx, plan.load, "full", plan.load.empty_init
    )
    state: dict[str, Any] = {"model": model, LIST_KEY: optimizers, "epoch": 0}
    strategy.load_checkpoint(path, state)
    out = {**_read_all(model, optimizers), "epoch": state["epoch"]}
    end(strategy)
    return out
