"""The arguments of the contract's methods that take more than one legal value: axes of calls.

A configuration (family, sharding, precision, ...) is fixed when the strategy is built; an
argument is chosen at each call. Each argument here is a parameter of a
:class:`harness.contract.Strategy` method to which the contract gives more than one legal
value; the values are written as the coverage table writes them (``"inf"``, ``"True"``,
``"None"``; ``"given"`` for any object other than ``None``; ``"non-zero"`` for any rank but 0).

A clause's ``scope`` names the argument axes it speaks of, with the values it speaks of
(``CLIP-1``: ``norm_type`` and ``error_if_nonfinite``); the suites' jobs report the values they
passed, so the per-clause coverage lists an argument value the clause's checks never passed.
An argument axis restricts no other axis of a scope (every configuration takes every value of
every argument) and is left out of the pairs of configuration values
(:mod:`harness.conformance.output.coverage`).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ARGUMENTS", "ARGUMENT_AXES", "Argument"]


@dataclass(frozen=True)
class Argument:
    """One argument of a contract method, as an axis.

    Attributes:
        name: the parameter's name, which is the axis's name.
        method: the :class:`harness.contract.Strategy` method that takes it.
        values: its legal values, as the coverage table writes them; a value the contract
            refuses (``storage_options`` other than ``None``) is legal to pass.
    """

    name: str
    method: str
    values: tuple[str, ...]


#: Every argument the contract gives more than one legal value, in the order of the methods
#: in :class:`harness.contract.Strategy`.
ARGUMENTS: tuple[Argument, ...] = (
    Argument("empty_init", "module_init_context", ("None", "True", "False")),
    Argument("norm_type", "clip_gradients_norm", ("2", "1", "inf", "1.5")),
    Argument("error_if_nonfinite", "clip_gradients_norm", ("True", "False")),
    Argument("enabled", "no_backward_sync", ("True", "False")),
    Argument("reduce_op", "all_reduce", ("mean", "sum")),
    Argument("src", "broadcast", ("0", "non-zero")),
    Argument("storage_options", "save_checkpoint", ("None", "given")),
    Argument("filter", "save_checkpoint", ("None", "given")),
    Argument("strict", "load_checkpoint", ("True", "False")),
)

#: The names of the argument axes.
ARGUMENT_AXES: frozenset[str] = frozenset(a.name for a in ARGUMENTS)
