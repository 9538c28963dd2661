"""Rank side of the training-session check (CONTRACT.md TRAIN-4): run one segment of ops.

A *segment* (:class:`~suites.lib.shared.session_ops.Segment`) is what one strategy instance
does: set up (fresh init), apply the session's structure so far (frozen names, added groups)
and load ``source`` if any (under the segment's ``load_clause``), then its ops in order. The
ranks keep nothing between jobs, so the session machine sends a segment once, when it ends;
at each ``Check`` op and at the end the job reads the gathered model and optimizer state with
torch's own APIs (:func:`suites.lib.ranks.checkpoint_jobs.read_state`), and the controller
compares every read with its plain twin's state at the same point.
"""

from __future__ import annotations

import dataclasses
from typing import Any, cast

import torch.distributed as dist
from torch import nn

from harness.verdicts.attribution import clause
from suites.lib.ranks.checkpoint_jobs import build, path_for, read_state
from suites.lib.ranks.training import Trained, end, hold_gradients, micro_step
from suites.lib.shared.models import clean_name
from suites.lib.shared.session_ops import (
    AddGroup,
    Check,
    Freeze,
    Load,
    Save,
    Segment,
    Step,
    Structure,
    after,
)
from suites.lib.shared.specs import OptimSpec, Scenario

__all__ = ["checkpoint_path", "segment_rank"]


def _params(model: nn.Module) -> dict[str, nn.Parameter]:
    return {clean_name(n): p for n, p in model.named_parameters()}


def _build(ctx: Any, segment: Segment, structure: Structure) -> Trained:
    """Set up without the held-back parameters in the optimizer, then apply ``structure``."""
    scenario = segment.scenario
    optim = cast(OptimSpec, _Excluding(scenario.optim, set(segment.held)))
    t = build(ctx, dataclasses.replace(scenario, optim=optim), segment.fmt)
    for name in sorted(structure.frozen):
        _apply(t, Freeze(name))
    for group in structure.groups:
        _apply(t, group)
    return t


class _Excluding:
    """An ``OptimSpec`` look-alike whose ``build`` leaves out the named parameters."""

    def __init__(self, optim: OptimSpec, held: set[str]) -> None:
        self.optim = optim
        self.held = held

    def __getattr__(self, name: str) -> Any:
        return getattr(self.optim, name)

    def build(self, named_params: Any) -> Any:
        kept = [(n, p) for n, p in named_params if clean_name(n) not in self.held]
        return self.optim.build(kept)


def _apply(t: Trained, op: Freeze | AddGroup) -> None:
    param = _params(t.model)[op.name]
    with clause("TRAIN-4"):
        if isinstance(op, Freeze):
            param.requires_grad_(not op.frozen)
        else:
            t.optimizer.add_param_group({"params": [param], "lr": op.lr})


def _take_step(t: Trained, scenario: Scenario, step: Step, dp_rank: int) -> None:
    plan = dataclasses.replace(scenario.plan, micro_batches=step.micro)
    sc = dataclasses.replace(scenario, plan=plan)
    for micro in range(step.micro):
        accumulate = micro < step.micro - 1
        with clause("SYNC-1"), t.strategy.no_backward_sync(t.model, enabled=accumulate):
            micro_step(t, sc, step.index, micro, dp_rank)
        if micro == 0 and step.save is not None:  # mid-accumulation: gradients pending
            with clause("TRAIN-4"):
                t.strategy.save_checkpoint(step.save, _state(t))
    if step.clip is not None:
        with clause("CLIP-1"):
            t.strategy.clip_gradients_norm(t.model, t.optimizer, max_norm=step.clip)
    with clause("API-4"):
        t.strategy.optimizer_step(t.optimizer)
    # The model's zero_grad, so that the held-back parameter's gradient (no optimizer holds
    # it) does not carry over a step. With the optimizer's, torch's FSDP1 itself (no
    # reference code: a 2-rank NO_SHARD Linear, bias held back, 2 micro-batches under
    # no_sync, drifts 3.6e-2 from plain torch in 2 SGD steps; FULL_SHARD and 1 micro-batch
    # do not) keeps the flat parameter's gradient while any of its original parameters
    # still has a .grad (FlatParamHandle._reset_flat_param_grad_info_if_needed), so the
    # other parameters' stale gradients are accumulated into the next step.
    t.model.zero_grad()


def _state(t: Trained) -> dict[str, Any]:
    return {"model": t.model, "optimizer": t.optimizer}


def segment_rank(ctx: Any, segment: Segment) -> dict[str, Any]:
    """Rank job: run ``segment``; return the gathered model and optimizer state at each
    ``Check`` (``"checks"``) and at the end (``"model"``, ``"optim"``), and under
    ``"restored"`` those of fresh objects that loaded a save of the end state (with a probe)."""
    structure = segment.structure
    t = _build(ctx, segment, structure)
    if segment.source is not None:
        _load(t, segment, segment.source, segment.strict, segment.pending, segment.load_clause)
    checks: list[dict[str, Any]] = []
    for op in segment.ops:
        if isinstance(op, Check):
            checks.append(_read(t))
        elif isinstance(op, Step):
            with clause("TRAIN-4"):
                _take_step(t, segment.scenario, op, t.strategy.distributed_sampler_kwargs["rank"])
        elif isinstance(op, (Freeze, AddGroup)):
            _apply(t, op)
            structure = after(structure, op)
        elif isinstance(op, Save):
            with clause("TRAIN-4"):
                t.strategy.save_checkpoint(op.path, _state(t))
        elif isinstance(op, Load):
            with clause("TRAIN-4"):
                t.strategy.load_checkpoint(op.path, _state(t), strict=op.strict)
        else:  # Rebuild
            t = _rebuild(ctx, t, segment, structure, op.path, op.pending)
    out = _read(t)
    out["checks"] = checks
    if segment.probe is not None:  # what a checkpoint of this state restores (the live
        # objects stay: a teardown before a load is the Rebuild op's to check)
        with clause("TRAIN-4"):
            t.strategy.save_checkpoint(segment.probe, _state(t))
        fresh = _build(ctx, segment, structure)
        with clause("TRAIN-4"):
            fresh.strategy.load_checkpoint(segment.probe, _state(fresh))
        out["restored"] = _read(fresh)
        end(fresh.strategy)
    end(t.strategy)
    return out


def _load(
    t: Trained, segment: Segment, path: str, strict: bool, pending: bool, clause_id: str
) -> None:
    """Load ``path`` into ``t``; with ``pending``, after a forward and a backward whose
    gradients are dropped after the load (the recipe's next step starts from none)."""
    if pending:
        with clause("TRAIN-4"):
            hold_gradients(t, segment.scenario, t.strategy.distributed_sampler_kwargs["rank"])
    with clause(clause_id):
        t.strategy.load_checkpoint(path, _state(t), strict=strict)
    if pending:
        t.model.zero_grad()


def _rebuild(
    ctx: Any, t: Trained, segment: Segment, structure: Structure, path: str, pending: bool
) -> Trained:
    """Save to ``path``, tear the strategy down, set up again with ``structure`` and load
    (after a forward and a backward with ``pending``)."""
    with clause("TRAIN-4"):
        t.strategy.save_checkpoint(path, _state(t))
    with clause("API-8"):
        t.strategy.teardown()
    t = _build(ctx, segment, structure)
    _load(t, segment, path, True, pending, "TRAIN-4")
    return t


def _read(t: Trained) -> dict[str, Any]:
    """:func:`read_state`, with two of torch's reader's habits undone (a collective).

    torch's FSDP1 reader raises when a trainable parameter of a flat parameter has no
    optimizer state while others have (the held-back parameter before its group is added,
    or after, until it steps): such a parameter reads as frozen for the read. And torch
    initializes the state of an optimizer that never stepped (on any rank) before reading
    it: that state is the read's, not the strategy's, and is dropped, from the read and from
    the optimizer (the plain optimizer has none, and its first step must be a first step).
    """
    params = [p for p in t.model.parameters() if p.requires_grad]
    stateless = _on_every_rank([p not in t.optimizer.state for p in params])
    fresh = all(_on_every_rank([not t.optimizer.state]))
    quiet = [p for p, none in zip(params, stateless, strict=True) if none and not fresh]
    held = {id(p) for group in t.optimizer.param_groups for p in group["params"]}
    quiet += [p for p in params if id(p) not in held and p not in quiet]
    for param in quiet:
        param.requires_grad_(False)
    try:
        out = read_state(t)
    finally:
        for param in quiet:
            param.requires_grad_(True)
    if fresh:
        out["optim"]["state"] = {}
        t.optimizer.state.clear()
    return out


def _on_every_rank(local: list[bool]) -> list[bool]:
    """``local`` and-ed over the ranks (an FSDP1 rank whose shard of a parameter is empty
    holds no state for it though the optimizer stepped it)."""
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, local)
    return [all(flags) for flags in zip(*everyone, strict=True)]


def checkpoint_path(root: str, name: str, fmt: str) -> str:
    """Where checkpoint ``name`` of format ``fmt`` lives under ``root``."""
    return path_for(f"{root}/{name}", fmt)


def setup_probe_rank(ctx: Any, scenario: Scenario, fmt: str) -> None:
    """Build ``scenario``'s strategy, model and optimizer (saving in ``fmt``) and tear them
    down: a strategy that refuses the configuration (``Unsupported``) says so in the rule that
    starts a segment, not when the segment runs at the session's teardown, where Hypothesis
    can no longer reject the example."""
    end(build(ctx, scenario, fmt).strategy)
