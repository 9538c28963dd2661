"""A second ``Block``: a zoo block that shares the name of
:class:`suites.lib.shared.models.Block` but is another class, of another module.

WRAP-1, FSDP2-1 and AC-1 speak of "each instance of those classes" for a policy given classes
(a set, a ``ModuleWrapPolicy``): an instance of a subclass of a listed class is selected
(:class:`suites.lib.shared.models.ScaledBlock`), and a module of a class that merely shares a
listed class's name is not (this one). A strategy that selects by class name
(``type(m).__name__ in names``) wraps it and fails those clauses; a model of the zoo holds it
as the block kind ``ForeignBlock`` (:data:`suites.lib.shared.models.LOOKALIKE_KINDS`).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from suites.lib.shared.layers import Linear

__all__ = ["Block"]


class Block(nn.Module):
    """A residual MLP without a norm, ``x + down(tanh(up(x)))``: not a subclass of the zoo's
    ``Block``, and named like it."""

    def __init__(self, hidden: int, ffn: int, *, seed: int, name: str):
        super().__init__()
        self.up = Linear(hidden, ffn, key=(seed, f"{name}.up"))
        self.down = Linear(ffn, hidden, key=(seed, f"{name}.down"))

    def forward(self, x: Tensor) -> Tensor:
        return x + self.down(torch.tanh(self.up(x)))
