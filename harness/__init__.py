"""shardcheck's harness: a persistent pool of rank processes and its pytest plugin."""

from __future__ import annotations

from harness.api import max_world_size, run_on_ranks, world_sizes
from harness.attribution import clause
from harness.context import RankContext
from harness.contract import MeshStrategy, Strategy, StrategySpec, Unsupported
from harness.outcomes import Outcome, RankFailure

__all__ = [
    "MeshStrategy",
    "Outcome",
    "RankContext",
    "RankFailure",
    "Strategy",
    "StrategySpec",
    "Unsupported",
    "clause",
    "max_world_size",
    "run_on_ranks",
    "world_sizes",
]
