"""The reference strategy with one distributed bug, for the hang and desync tests.

``barrier_on_rank_zero``: ``load_checkpoint(..., strict=False)`` enters ``barrier()`` on
rank 0 only, so rank 0 waits in a barrier while rank 1 goes on into the load's own
collectives: the ranks' collectives no longer match (a desync).
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

import reference_impl
from harness.contract import StrategySpec

__all__ = ["barrier_on_rank_zero"]


class _BarrierOnRankZero:
    def load_checkpoint(self, path: Any, state: Any = None, strict: bool = True) -> Any:
        if not strict and dist.get_rank() == 0:
            dist.barrier()  # the bug: only rank 0 enters it
        return super().load_checkpoint(path, state, strict)  # type: ignore[misc]


def barrier_on_rank_zero(spec: StrategySpec) -> Any:
    """Factory: the reference strategy whose non-strict load barriers on rank 0 only."""
    reference = reference_impl.make_strategy(spec)
    cls = type(
        f"BarrierOnRankZero{type(reference).__name__}", (_BarrierOnRankZero, type(reference)), {}
    )
    strategy: Any = object.__new__(cls)
    strategy.__dict__.update(reference.__dict__)
    return strategy
