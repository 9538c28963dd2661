"""shardcheck's harness: a persistent pool of rank processes and its pytest plugin."""

from __future__ import annotations

from typing import TYPE_CHECKING

from harness.entry.lazy import lazy_exports

if TYPE_CHECKING:
    from harness.api import max_world_size, run_on_ranks, world_sizes
    from harness.contract import MeshStrategy, Strategy, StrategySpec, Unsupported
    from harness.rank.context import RankContext
    from harness.verdicts.attribution import clause, looking
    from harness.verdicts.outcomes import Outcome, RankFailure

__all__ = [
    "MeshStrategy",
    "Outcome",
    "RankContext",
    "RankFailure",
    "Strategy",
    "StrategySpec",
    "Unsupported",
    "clause",
    "looking",
    "max_world_size",
    "run_on_ranks",
    "world_sizes",
]

#: where each name lives: imported on first use, so that importing a submodule (the pytest
#: plugins do, in every pytest run of the environment) does not import torch
_HOMES = {
    "MeshStrategy": "harness.contract",
    "Outcome": "harness.verdicts.outcomes",
    "RankContext": "harness.rank.context",
    "RankFailure": "harness.verdicts.outcomes",
    "Strategy": "harness.contract",
    "StrategySpec": "harness.contract",
    "Unsupported": "harness.contract",
    "clause": "harness.verdicts.attribution",
    "looking": "harness.verdicts.attribution",
    "max_world_size": "harness.api",
    "run_on_ranks": "harness.api",
    "world_sizes": "harness.api",
}


__getattr__ = lazy_exports(globals(), _HOMES)
