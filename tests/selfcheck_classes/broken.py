"""The reference strategies with a policy of classes read wrong, one way each
(``--strategy selfcheck_classes.broken:<factory>``); ``test_policy_bugs_caught.py`` runs the
wrap and checkpointing checks against each.

A policy of classes (a set, a ``ModuleWrapPolicy``) selects "each instance of those classes"
(WRAP-1, FSDP2-1, AC-1): a subclass's instance too, and no module of another class that only
shares a listed class's name. Strategies that match classes by hand get that wrong two ways:

- ``wraps_by_exact_type`` (fsdp): the wrap policy's classes matched by ``type(m) in classes``:
  an instance of a subclass of a listed class is no unit of its own (WRAP-1);
- ``wraps_by_class_name`` (fsdp2): matched by ``type(m).__name__ in names``: another module's
  class named like a listed class gets a ``fully_shard`` of its own (FSDP2-1);
- ``checkpoints_by_class_name`` (fsdp, fsdp2): the activation-checkpointing policy's classes
  matched by name: another module's same-named class is checkpointed (AC-1).

Each factory builds the reference strategy and replaces the one policy with the wrong
reading; every other family and option is the reference's.
"""

from __future__ import annotations

import functools
from typing import Any

from torch import nn
from torch.distributed.fsdp.wrap import CustomPolicy, ModuleWrapPolicy

import reference_impl
from harness.contract import StrategySpec

__all__ = [
    "BUGS",
    "checkpoints_by_class_name",
    "wraps_by_class_name",
    "wraps_by_exact_type",
]

#: factory -> the clause whose checks must catch it (and no other)
BUGS = {
    "wraps_by_exact_type": "WRAP-1",
    "wraps_by_class_name": "FSDP2-1",
    "checkpoints_by_class_name": "AC-1",
}


def _listed(policy: Any) -> frozenset[type[nn.Module]] | None:
    """The classes of a policy of classes (FSDP1's ``ModuleWrapPolicy``, fsdp2's resolved
    set); None for any other policy (a callable picks for itself)."""
    if isinstance(policy, ModuleWrapPolicy):
        return frozenset(policy._module_classes)
    if isinstance(policy, frozenset):
        return policy
    return None


def _exact_type(module: nn.Module, *, classes: frozenset[type[nn.Module]]) -> bool:
    return type(module) in classes  # BUG: a subclass's instance is an instance too


def _class_name(module: nn.Module, *, names: frozenset[str]) -> bool:
    return type(module).__name__ in names  # BUG: another module's class of the same name


def _by_name(policy: Any) -> Any:
    classes = _listed(policy)
    if classes is None:
        return policy
    return functools.partial(_class_name, names=frozenset(c.__name__ for c in classes))


def wraps_by_exact_type(spec: StrategySpec) -> Any:
    """fsdp: the auto-wrap policy's classes matched by exact type (WRAP-1)."""
    strategy = reference_impl.make_strategy(spec)
    classes = _listed(getattr(strategy, "auto_wrap_policy", None))
    if spec.family == "fsdp" and classes is not None:
        strategy.auto_wrap_policy = CustomPolicy(functools.partial(_exact_type, classes=classes))
    return strategy


def wraps_by_class_name(spec: StrategySpec) -> Any:
    """fsdp2: the auto-wrap policy's classes matched by name (FSDP2-1): a ``fn(module)``
    policy, which the fsdp2 strategy applies module by module."""
    strategy = reference_impl.make_strategy(spec)
    if spec.family == "fsdp2":
        strategy.auto_wrap_policy = _by_name(strategy.auto_wrap_policy)
    return strategy


def checkpoints_by_class_name(spec: StrategySpec) -> Any:
    """fsdp and fsdp2: the activation-checkpointing policy's classes matched by name (AC-1)."""
    strategy = reference_impl.make_strategy(spec)
    policy = getattr(strategy, "activation_checkpointing_policy", None)
    if spec.family in ("fsdp", "fsdp2") and _listed(policy) is not None:
        strategy.activation_checkpointing_policy = CustomPolicy(_by_name(policy))
    return strategy
