"""Running scenarios on the ranks: set-up and training through the plug-in contract only.

:func:`setup` builds the strategy with ``ctx.make_strategy`` and the model and optimizer of a
scenario; :func:`train` runs its plan (micro-batches under ``no_backward_sync``, clipping,
steps); :func:`train_rank` does both and returns a :class:`RankResult` of CPU tensors read with
torch's own APIs. The controller sends these jobs with :func:`suites.lib.controller.dispatch.run`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from harness import RankContext, Strategy
from harness.verdicts.attribution import clause
from suites.lib.ranks.readers import gathered_grads, gathered_state, local_grads, scaling
from suites.lib.shared.arguments import passes, plan_arguments
from suites.lib.shared.models import Linear, build_model, make_batch
from suites.lib.shared.specs import Scenario

__all__ = [
    "RankResult",
    "Trained",
    "compute_dtypes",
    "end",
    "hold_gradients",
    "micro_step",
    "optimizer_state_dtypes",
    "setup",
    "train",
    "train_rank",
]


@dataclass
class Trained:
    """The live objects of a rank after :func:`setup`."""

    strategy: Strategy
    model: nn.Module
    optimizer: torch.optim.Optimizer


@dataclass
class RankResult:
    """What one rank reports to the controller (picklable, CPU tensors).

    Attributes:
        rank: the global rank.
        dp_rank: the data-parallel rank it took its batches for
            (``strategy.distributed_sampler_kwargs["rank"]``).
        losses: ``losses[step][micro]``: unscaled micro-batch losses.
        norms: what ``clip_gradients_norm`` returned, per step.
        scaled: per clipped step, the factor this rank's gradients were scaled by in the
            clip (:func:`~suites.lib.ranks.readers.scaling`), None where it holds none or the
            precision unscales in the same call (``16-mixed``: the loss scale is not known).
        state: the gathered model state dict after training.
        grads: the gathered gradients of the last step (when asked for).
        extra: test-specific observations.
    """

    rank: int
    dp_rank: int
    losses: list[list[float]] = field(default_factory=list)
    norms: list[float] = field(default_factory=list)
    scaled: list[float | None] = field(default_factory=list)
    state: dict[str, Tensor] = field(default_factory=dict)
    grads: dict[str, Tensor | None] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


def setup(ctx: RankContext, scenario: Scenario, **overrides: Any) -> Trained:
    """Build strategy, model and optimizer of ``scenario`` on this rank.

    Args:
        ctx: the harness ``RankContext``.
        scenario: the scenario.
        **overrides: strategy options replacing the scenario's (e.g. ``auto_wrap_policy``).
    """
    options = {**scenario.options(), **overrides}
    with clause("API-1"):  # building the strategy and its environment
        strategy = ctx.make_strategy(scenario.family, **options)
        strategy.setup_environment()
    with clause("API-3"), strategy.module_init_context(empty_init=scenario.empty_init):
        model: nn.Module = build_model(scenario.model)
    with clause("API-2"):
        model = strategy.setup_module(model)
        optimizer = strategy.setup_optimizer(scenario.optim.build(model.named_parameters()))
    return Trained(strategy, model, optimizer)


def end(*strategies: Strategy) -> None:
    """Tear the strategies down; a raising ``teardown`` is a late API-8 violation (reported
    once as its own finding) that leaves the check's verdict standing."""
    for strategy in strategies:
        with clause("API-8", after=True):
            strategy.teardown()


def micro_step(t: Trained, scenario: Scenario, step: int, micro: int, dp_rank: int) -> float:
    """Forward and backward of one micro-batch; returns its unscaled loss."""
    plan = scenario.plan
    x, y = make_batch(scenario.model, plan.data_seed, step, micro, dp_rank, plan.batch_size)
    device = t.strategy.root_device
    x = t.strategy.precision.convert_input(x.to(device))
    with clause("API-2"), t.strategy.precision.forward_context():
        out = t.model(x)
    loss = F.mse_loss(out.float(), y.to(device)) * plan.loss_scale
    with clause("API-4"):
        t.strategy.backward(loss / plan.micro_batches, t.model)
    return float(loss.detach())


def hold_gradients(t: Trained, scenario: Scenario, dp_rank: int) -> None:
    """A forward and a backward of one micro-batch, no step: the parameters hold gradients,
    as in a recipe that resumes from a checkpoint after its first micro-batch (CKPT-RT-1,
    TRAIN-4). The buffers the checkpoint does not hold (non-persistent ones) are put back
    as they were, so that what follows a load meets the same ones as without the pass."""
    persistent = set(t.model.state_dict())
    kept = {n: b.detach().clone() for n, b in t.model.named_buffers() if n not in persistent}
    micro_step(t, scenario, 0, 0, dp_rank)
    with torch.no_grad():
        for n, b in t.model.named_buffers():
            if n in kept:
                b.copy_(kept[n])


def train(
    t: Trained,
    scenario: Scenario,
    result: RankResult,
    *,
    steps: int | None = None,
    grads: bool = False,
) -> None:
    """Run the scenario's plan; record losses, clip norms and the factor each clip scaled this
    rank's gradients by into ``result``.

    All micro-batches but the last of a step run under ``no_backward_sync(enabled=True)``;
    with one micro-batch the context is entered with ``enabled=False`` (a no-op). A clipped
    plan passes its ``norm_type`` and ``error_if_nonfinite``.

    Args:
        t: the set-up objects.
        scenario: the scenario.
        result: where losses, norms (and grads) go.
        steps: override ``scenario.plan.steps``.
        grads: gather the last step's gradients (after clipping) into ``result.grads``.
    """
    plan = scenario.plan
    steps = plan.steps if steps is None else steps
    for step in range(steps):
        losses = []
        for micro in range(plan.micro_batches):
            accumulate = micro < plan.micro_batches - 1
            with clause("SYNC-1"), t.strategy.no_backward_sync(t.model, enabled=accumulate):
                losses.append(micro_step(t, scenario, step, micro, result.dp_rank))
        result.losses.append(losses)
        if plan.clip is not None:
            before = [g.detach().clone() for g in local_grads(t.model)]
            with clause("CLIP-1"):
                norm = t.strategy.clip_gradients_norm(
                    t.model,
                    t.optimizer,
                    max_norm=plan.clip,
                    norm_type=plan.norm_type,
                    error_if_nonfinite=plan.error_if_nonfinite,
                )
            result.norms.append(float(norm))
            unscales = scenario.precision == "16-mixed"
            result.scaled.append(None if unscales else scaling(before, local_grads(t.model)))
        if grads and step == steps - 1:
            result.grads = gathered_grads(t.model)
        with clause("API-4"):
            t.strategy.optimizer_step(t.optimizer)
        t.optimizer.zero_grad()


@passes(lambda scenario, grads=False: plan_arguments(scenario))
def train_rank(ctx: RankContext, scenario: Scenario, grads: bool = False) -> RankResult:
    """Rank function: set up, train the plan, return the gathered state (and grads).

    Args:
        ctx: the harness ``RankContext``.
        scenario: the scenario.
        grads: also gather the last step's gradients (after clipping, before the step).
    """
    t = setup(ctx, scenario)
    result = RankResult(rank=ctx.rank, dp_rank=t.strategy.distributed_sampler_kwargs["rank"])
    train(t, scenario, result, grads=grads)
    result.state = gathered_state(t.model)
    end(t.strategy)
    return result


def compute_dtypes(t: Trained, scenario: Scenario) -> dict[str, str]:
    """Run one micro-batch; the dtypes of the first ``Linear``'s weight and output in it."""
    seen: dict[str, str] = {}

    def record(module: nn.Module, args: Any, output: torch.Tensor) -> None:
        seen.setdefault("weight", str(module.weight.dtype))
        seen.setdefault("output", str(output.dtype))

    linear = next(m for m in t.model.modules() if isinstance(m, Linear))
    # first among the forward hooks: a Linear that is an FSDP2 unit of its own (a size
    # policy picks it) reshards in its own post-forward hook, after which ``weight`` is the
    # float32 shard again, not what the forward computed with
    handle = linear.register_forward_hook(record, prepend=True)
    try:
        micro_step(t, scenario, 0, 0, t.strategy.distributed_sampler_kwargs["rank"])
    finally:
        handle.remove()
    return seen


def optimizer_state_dtypes(optimizer: Any) -> list[str]:
    """The dtypes of the optimizer's floating-point state tensors (``step`` left out)."""
    return sorted(
        {
            str(v.dtype)
            for state in optimizer.state.values()
            for k, v in state.items()
            if k != "step" and isinstance(v, torch.Tensor) and v.is_floating_point()
        }
    )
