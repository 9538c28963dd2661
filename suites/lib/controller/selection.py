"""What a policy selected against what it should have: the words of a check's failure.

When the units or the checkpointed modules a strategy made differ from those its policy
selects (WRAP-1, FSDP2-1, AC-1), :func:`selection_difference` names each module missing or
extra with its class's full name, so that a failure on a subclass of a listed class
(``suites.lib.shared.models.ScaledBlock``) or on another module's class of a listed name
(``suites.lib.shared.lookalike.Block``) says so in its first line.
"""

from __future__ import annotations

from collections.abc import Iterable

from torch import nn

__all__ = ["selection_difference"]


def _named(model: nn.Module, names: list[str]) -> str:
    modules = dict(model.named_modules())
    described = []
    for name in names:
        cls = type(modules[name]) if name in modules else None
        what = f"{cls.__module__}.{cls.__qualname__}" if cls is not None else "not in the model"
        described.append(f"{name or '<root>'} ({what})")
    return ", ".join(described)


def selection_difference(model: nn.Module, made: Iterable[str], selected: Iterable[str]) -> str:
    """The modules of ``model`` (the plain model) in ``selected`` but not ``made`` (missing)
    and in ``made`` but not ``selected`` (extra), each with its class's full name:
    ``"missing blocks.1 (suites.lib.shared.models.ScaledBlock)"``; empty when they agree."""
    made, selected = set(made), set(selected)
    parts = []
    if selected - made:
        parts.append(f"missing {_named(model, sorted(selected - made))}")
    if made - selected:
        parts.append(f"extra {_named(model, sorted(made - selected))}")
    return "; ".join(parts)
