"""shardcheck's harness: a persistent pool of rank processes and its pytest plugin."""

from __future__ import annotations

from harness.contract import StrategySpec, Unsupported

__all__ = ["StrategySpec", "Unsupported"]
