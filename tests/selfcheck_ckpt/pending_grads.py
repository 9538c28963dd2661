"""Planted bugs of a load into an optimizer that never stepped while its parameters hold
gradients (a recipe that ran a forward and a backward, then resumed from a checkpoint).

torch's ``get_optimizer_state_dict``/``set_optimizer_state_dict`` initialize a never-stepped
optimizer's state with a zero-gradient, zero-learning-rate step, but skip it when any of its
parameters holds a gradient (pytorch#140898). The reference sets those gradients aside while
it reads the target of a sharded load (``reference_impl/checkpoint/optimizers.py``, [Note:
gradients held at a load]). Each factory here gives the reference strategy one way to get
that wrong; ``test_pending_grads_load.py`` shows CKPT-RT-1/2's moment check catching it.
"""

from __future__ import annotations

from typing import Any
from unittest import mock

import torch
from torch.optim import Optimizer

from harness.contract import StrategySpec
from selfcheck_ckpt.broken import _with_bug

__all__ = ["keeps_grads_at_load", "steps_with_held_grads"]


class KeepsGradsAtLoad:
    """The reference's load without its work-around: torch reads the never-stepped optimizer
    as stateless while gradients are held, so the sharded load has nothing to read the
    checkpoint's optimizer state into and drops it."""

    def load_checkpoint(self, path: Any, state: Any = None, strict: bool = True) -> Any:
        with mock.patch("reference_impl.checkpoint.optimizers._grads_aside", _keep_grads):
            return super().load_checkpoint(path, state, strict)  # type: ignore[misc]


class _KeepGrads:
    """A context manager that leaves the gradients where they are."""

    def __init__(self, optimizers: Any) -> None:
        del optimizers

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _keep_grads(optimizers: Any) -> _KeepGrads:
    return _KeepGrads(optimizers)


class StepsWithHeldGrads:
    """Makes sure a never-stepped optimizer has state after a load by stepping it, with the
    gradients its parameters hold and its learning rate: the loaded parameters move and the
    loaded state advances a step."""

    def load_checkpoint(self, path: Any, state: Any = None, strict: bool = True) -> Any:
        values = state.values() if isinstance(state, dict) else ()
        optimizers = [v for v in values if isinstance(v, Optimizer)]
        fresh = [
            opt
            for opt in optimizers
            if not opt.state
            and any(p.grad is not None for g in opt.param_groups for p in g["params"])
        ]
        out = super().load_checkpoint(path, state, strict)  # type: ignore[misc]
        with torch.no_grad():
            for opt in fresh:
                opt.step()
        return out


def keeps_grads_at_load(spec: StrategySpec) -> Any:
    """Factory: :class:`KeepsGradsAtLoad` (breaks CKPT-RT-2: the sharded load)."""
    return _with_bug(spec, KeepsGradsAtLoad)


def steps_with_held_grads(spec: StrategySpec) -> Any:
    """Factory: :class:`StepsWithHeldGrads` (breaks CKPT-RT-1 and CKPT-RT-2)."""
    return _with_bug(spec, StepsWithHeldGrads)
