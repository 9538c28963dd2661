"""Rank side of the training-session check (SPEC.md TRAIN-4): replay one segment of ops.

A *segment* is what one strategy instance does: set up (fresh init), apply the session's
structure so far (frozen names, added groups) and load ``source`` if any, then its ops in
order. The ranks keep nothing between jobs, so every rule of the session machine replays
the current segment in one job and reads the gathered model and optimizer state with
torch's own APIs (:func:`suites.checkpoint_jobs.read_state`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, cast

from torch import nn

from harness.attribution import clause
from suites._run import Trained, end, micro_step
from suites.checkpoint_jobs import build, path_for, read_state
from suites.models import clean_name
from suites.specs import OptimSpec, Scenario

__all__ = [
    "AddGroup",
    "Freeze",
    "Load",
    "Rebuild",
    "Save",
    "Segment",
    "Step",
    "Structure",
    "segment_rank",
]


@dataclass(frozen=True)
class Step:
    """One optimizer step: global data index, micro-batches, clip ``max_norm`` or None."""

    index: int
    micro: int
    clip: float | None


@dataclass(frozen=True)
class Freeze:
    """Set ``requires_grad`` of parameter ``name`` to ``not frozen``."""

    name: str
    frozen: bool = True


@dataclass(frozen=True)
class AddGroup:
    """``optimizer.add_param_group`` with parameter ``name`` at learning rate ``lr``."""

    name: str
    lr: float


@dataclass(frozen=True)
class Save:
    """Save model and optimizer to ``path`` in format ``fmt`` (``full`` or ``sharded``)."""

    path: str
    fmt: str


@dataclass(frozen=True)
class Load:
    """Load ``path`` into the live model and optimizer."""

    path: str
    strict: bool


@dataclass(frozen=True)
class Rebuild:
    """Save sharded to ``path``, tear the strategy down, build it again and load ``path``."""

    path: str


@dataclass(frozen=True)
class Structure:
    """The session's structural changes so far: frozen names and added groups (in order)."""

    frozen: frozenset[str] = frozenset()
    groups: tuple[AddGroup, ...] = ()


Op = Step | Freeze | AddGroup | Save | Load | Rebuild


@dataclass
class Segment:
    """Set up ``scenario`` (with ``structure`` and ``source`` loaded), then ``ops``.

    ``held`` names the parameters the optimizer is built without (added as groups later).
    """

    scenario: Scenario
    fmt: str
    held: tuple[str, ...]
    structure: Structure = field(default_factory=Structure)
    source: str | None = None
    strict: bool = True
    ops: list[Op] = field(default_factory=list)


def _params(model: nn.Module) -> dict[str, nn.Parameter]:
    return {clean_name(n): p for n, p in model.named_parameters()}


def _build(ctx: Any, segment: Segment, structure: Structure) -> Trained:
    """Set up without the held-back parameters in the optimizer, then apply ``structure``."""
    scenario = segment.scenario
    held = set(segment.held)
    optim = cast(OptimSpec, _Excluding(scenario.optim, held))
    t = build(ctx, dataclasses.replace(scenario, optim=optim), segment.fmt)
    for name in structure.frozen:
        _apply(t, Freeze(name))
    for group in structure.groups:
        _apply(t, group)
    return t


class _Excluding:
    """An ``OptimSpec`` look-alike whose ``build`` leaves out the named parameters."""

    def __init__(self, optim: Any, held: set[str]) -> None:
        self.optim = optim
        self.held = held

    def __getattr__(self, name: str) -> Any:
        return getattr(self.optim, name)

    def build(self, named_params: Any) -> Any:
        kept = [(n, p) for n, p in named_params if clean_name(n) not in self.held]
        return self.optim.build(kept)


def _apply(t: Trained, op: Freeze | AddGroup) -> None:
    param = _params(t.model)[op.name]
    if isinstance(op, Freeze):
        with clause("TRAIN-4"):
            param.requires_grad_(not op.frozen)
    else:
        with clause("TRAIN-4"):
            t.optimizer.add_param_group({"params": [param], "lr": op.lr})


def _take_step(t: Trained, scenario: Scenario, step: Step, dp_rank: int) -> None:
    plan = dataclasses.replace(scenario.plan, micro_batches=step.micro)
    sc = dataclasses.replace(scenario, plan=plan)
    for micro in range(step.micro):
        accumulate = micro < step.micro - 1
        with clause("SYNC-1"), t.strategy.no_backward_sync(t.model, enabled=accumulate):
            micro_step(t, sc, step.index, micro, dp_rank)
    if step.clip is not None:
        with clause("CLIP-1"):
            t.strategy.clip_gradients_norm(t.model, t.optimizer, max_norm=step.clip)
    with clause("API-4"):
        t.strategy.optimizer_step(t.optimizer)
    t.optimizer.zero_grad()


def _state(t: Trained) -> dict[str, Any]:
    return {"model": t.model, "optimizer": t.optimizer}


def segment_rank(ctx: Any, segment: Segment) -> dict[str, Any]:
    """Replay ``segment`` on this rank; return the gathered model and optimizer state."""
    structure = segment.structure
    t = _build(ctx, segment, structure)
    if segment.source is not None:
        with clause("TRAIN-4"):
            t.strategy.load_checkpoint(segment.source, _state(t), strict=segment.strict)
    for op in segment.ops:
        if isinstance(op, Step):
            with clause("TRAIN-4"):
                _take_step(t, segment.scenario, op, t.strategy.distributed_sampler_kwargs["rank"])
        elif isinstance(op, (Freeze, AddGroup)):
            _apply(t, op)
            structure = _after(structure, op)
        elif isinstance(op, Save):
            with clause("TRAIN-4"):
                t.strategy.save_checkpoint(op.path, _state(t))
        elif isinstance(op, Load):
            with clause("TRAIN-4"):
                t.strategy.load_checkpoint(op.path, _state(t), strict=op.strict)
        else:
            with clause("TRAIN-4"):
                t.strategy.save_checkpoint(op.path, _state(t))
            with clause("API-8"):
                t.strategy.teardown()
            t = _build(ctx, dataclasses.replace(segment, fmt="sharded"), structure)
            with clause("TRAIN-4"):
                t.strategy.load_checkpoint(op.path, _state(t))
    out = read_state(t)
    end(t.strategy)
    return out


def _after(structure: Structure, op: Freeze | AddGroup) -> Structure:
    if isinstance(op, AddGroup):
        return dataclasses.replace(structure, groups=(*structure.groups, op))
    frozen = structure.frozen | {op.name} if op.frozen else structure.frozen - {op.name}
    return dataclasses.replace(structure, frozen=frozenset(frozen))


def checkpoint_path(root: str, name: str, fmt: str) -> str:
    """Where checkpoint ``name`` of format ``fmt`` lives under ``root``."""
    return path_for(f"{root}/{name}", fmt)
