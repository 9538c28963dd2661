"""Strategy factories for the acceptance tests: one deliberately broken, one that refuses.

Both wrap the reference implementation, so everything but the one defect is conforming.
"""

from __future__ import annotations

import functools
from typing import Any

from torch.optim import Optimizer

from harness.contract import StrategySpec, Unsupported
from reference_impl import make_strategy as reference_make_strategy


@functools.cache
def _broken(cls: type) -> type:
    """A subclass of ``cls`` whose ``load_checkpoint`` leaves every optimizer out of the load."""

    def load_checkpoint(self: Any, path: Any, state: Any = None, strict: bool = True) -> Any:
        if isinstance(state, dict):
            state = {k: v for k, v in state.items() if not isinstance(v, Optimizer)}
        return cls.load_checkpoint(self, path, state, strict=strict)

    return type(f"OptimizerDropping{cls.__name__}", (cls,), {"load_checkpoint": load_checkpoint})


def drops_optimizer_state(spec: StrategySpec) -> Any:
    """The reference strategy, except that loading a checkpoint drops the optimizer state."""
    strategy = reference_make_strategy(spec)
    strategy.__class__ = _broken(type(strategy))
    return strategy


def fsdp_only(spec: StrategySpec) -> Any:
    """The reference strategy for the fsdp family; the model_parallel family is refused."""
    if spec.family == "model_parallel":
        raise Unsupported("this strategy has no tensor parallelism", "family", spec.family)
    return reference_make_strategy(spec)
