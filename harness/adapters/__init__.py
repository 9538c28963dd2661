"""Adapters that present other projects' strategies through shardcheck's factory contract.

Each adapter module offers ``make_strategy(spec)`` (the project's own strategies) and
``factory(...)`` (your subclasses of them). Adapters are optional extras: import the module
you need (``harness.adapters.lightning`` needs ``pip install 'shardcheck[lightning]'``).
"""

from __future__ import annotations

__all__: list[str] = []
