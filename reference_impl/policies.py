"""Wrap and activation-checkpointing policies (CONTRACT.md CFG-4, WRAP-1, AC-1).

A *policy* names modules: a set (or list/tuple) of module classes, a torch
``ModuleWrapPolicy``/``CustomPolicy`` object, or a callable with FSDP's signature
``fn(module, recurse, nonwrapped_numel) -> bool``. :func:`normalize_policy` checks one and
turns a set of classes into a ``ModuleWrapPolicy``; :func:`select_modules` says which modules
a policy selects, the way FSDP's auto wrapping would; :func:`apply_activation_checkpointing`
wraps exactly those modules in non-reentrant checkpoint wrappers, outermost only.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from typing import Any

from torch import nn
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

from harness.torch_compat import CheckpointImpl, CheckpointWrapper, checkpoint_wrapper
from harness.torch_compat import WrapPolicyBase as _Policy

__all__ = [
    "Policy",
    "apply_activation_checkpointing",
    "has_checkpoint_wrappers",
    "normalize_policy",
    "select_modules",
]

Policy = _Policy | Callable[..., bool]


def _as_classes(option: str, value: Iterable[Any]) -> set[type[nn.Module]]:
    classes = set(value)
    bad = [c for c in classes if not (isinstance(c, type) and issubclass(c, nn.Module))]
    if bad or not classes:
        raise TypeError(
            f"{option}={value!r} must be a non-empty set of nn.Module subclasses; "
            f"{bad or 'nothing'} is not."
        )
    return classes


def normalize_policy(option: str, value: Any) -> Policy | None:
    """Validate a policy argument and return it in a form FSDP accepts.

    Args:
        option: the constructor argument's name, for error messages.
        value: ``None``, a set/list/tuple of module classes, a ``ModuleWrapPolicy`` or
            ``CustomPolicy`` (any torch ``_Policy``), or a callable policy.

    Raises:
        TypeError: anything else, naming the option and the value.
    """
    if value is None or isinstance(value, _Policy):
        return value
    if isinstance(value, (set, frozenset, list, tuple)):
        return ModuleWrapPolicy(_as_classes(option, value))
    if isinstance(value, type) and issubclass(value, nn.Module):
        return ModuleWrapPolicy({value})
    if callable(value):
        return value
    raise TypeError(
        f"{option}={value!r} is not a policy: pass a set of nn.Module classes, a "
        "ModuleWrapPolicy/CustomPolicy, or a callable fn(module, recurse, nonwrapped_numel)."
    )


def select_modules(root: nn.Module, policy: Policy) -> list[nn.Module]:
    """The modules of ``root`` that ``policy`` selects, in ``root.modules()`` order.

    For a torch ``_Policy`` this is the policy's own answer; for a callable it replays FSDP's
    bottom-up recursion (a module is selected when the parameters not already covered by
    selected descendants satisfy ``policy(module, recurse=False, nonwrapped_numel=...)``).
    The root is left out: it is always sharded as a whole anyway.
    """
    if isinstance(policy, _Policy):
        chosen = set(policy._run_policy(root, set(), {}))
    else:
        chosen = set()
        _replay_callable(root, policy, chosen, is_root=True)
    return [m for m in root.modules() if m in chosen and m is not root]


def _replay_callable(
    module: nn.Module, policy: Callable[..., bool], chosen: set[nn.Module], *, is_root: bool
) -> int:
    """Mirror of FSDP's recursive wrapping; returns the numel covered by selected modules."""
    numel = sum(p.numel() for p in module.parameters())
    if not policy(module=module, recurse=True, nonwrapped_numel=numel):
        return 0
    covered = sum(_replay_callable(c, policy, chosen, is_root=False) for c in module.children())
    if not is_root and policy(module=module, recurse=False, nonwrapped_numel=numel - covered):
        chosen.add(module)
        return numel
    return covered


def has_checkpoint_wrappers(module: nn.Module) -> bool:
    """Whether ``module`` already contains activation-checkpoint wrappers."""
    return any(isinstance(m, CheckpointWrapper) for m in module.modules())


def apply_activation_checkpointing(root: nn.Module, selected: Iterable[nn.Module]) -> int:
    """Wrap each selected module of ``root`` in a non-reentrant checkpoint wrapper.

    Only the outermost selected modules are wrapped (a wrapper is never nested in another).
    If ``root`` already contains checkpoint wrappers it warns and does nothing (AC-1).

    Args:
        root: the (already sharded) model; selected modules are found by identity.
        selected: modules chosen on the unwrapped model (e.g. by :func:`select_modules`).

    Returns:
        The number of modules wrapped.
    """
    targets = {id(m) for m in selected}
    if not targets:
        return 0
    if has_checkpoint_wrappers(root):
        warnings.warn(
            "The model already contains activation-checkpointed layers "
            "(CheckpointWrapper), so activation_checkpointing_policy is not applied again.",
            UserWarning,
            stacklevel=3,
        )
        return 0
    return _wrap_outermost(root, targets)


def _wrap_outermost(parent: nn.Module, targets: set[int]) -> int:
    count = 0
    for name, child in list(parent.named_children()):
        if id(child) in targets:
            setattr(
                parent, name, checkpoint_wrapper(child, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
            )
            count += 1
        else:
            count += _wrap_outermost(child, targets)
    return count
