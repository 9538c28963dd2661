"""Optimizer state dicts in two forms: keyed by parameter names, or by integer ids.

- The **named** form is what a full checkpoint holds under an optimizer's key (what
  ``get_optimizer_state_dict(..., full_state_dict=True)`` returns): ``state`` keyed by
  parameter names (FQNs as in the plain model) and each group's ``params`` a list of names.
- The **standard** form is what a plain torch optimizer's ``state_dict()`` returns and
  what trainers store in ``optimizer_states``: parameter ids ``0..n-1`` numbered in
  ``param_groups`` order (group 0's parameters first, in their order in the group).

The ids of a standard-form dict map to names by position: the i-th id of group g is the
i-th parameter of group g of the optimizer it is loaded into, exactly as torch's
``Optimizer.load_state_dict`` matches them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torch import nn
from torch.optim import Optimizer

__all__ = [
    "check_param_groups",
    "is_standard_optimizer_state",
    "plain_param_names",
    "to_named_optimizer_state",
    "to_standard_optimizer_state",
]


def _groups(osd: Mapping[str, Any], what: str) -> list[dict[str, Any]]:
    if not isinstance(osd, Mapping) or "param_groups" not in osd:
        raise ValueError(
            f"{what} is not an optimizer state dict: expected a dict with 'state' and "
            f"'param_groups', got {type(osd).__name__}"
            + (f" with keys {sorted(map(str, osd))}" if isinstance(osd, Mapping) else "")
            + "."
        )
    return [dict(group) for group in osd["param_groups"]]


def is_standard_optimizer_state(osd: Mapping[str, Any]) -> bool:
    """Tell whether an optimizer state dict is keyed by integer ids (the standard form).

    Args:
        osd: An optimizer state dict (``{"state": ..., "param_groups": [...]}``).

    Returns:
        True if its parameter references are integers, False if they are names.
    """
    params = [p for group in _groups(osd, "The value") for p in group.get("params", [])]
    keys = list(osd.get("state", {}))
    refs = params + keys
    return bool(refs) and all(isinstance(r, int) and not isinstance(r, bool) for r in refs)


def to_standard_optimizer_state(named_osd: Mapping[str, Any]) -> dict[str, Any]:
    """Convert a named optimizer state dict to the plain optimizer's integer-keyed form.

    Parameter ids are numbered ``0..n-1`` in ``param_groups`` order, so the result loads
    into a plain, unsharded optimizer built with the same parameter groups in the same
    order (``optimizer.load_state_dict(to_standard_optimizer_state(ckpt["optimizer"]))``).

    Args:
        named_osd: An optimizer state dict keyed by parameter names, as a full checkpoint
            stores it.

    Returns:
        A new state dict keyed by integer ids (tensors are shared, not copied).

    Raises:
        ValueError: If ``named_osd`` is not an optimizer state dict, or its ``state`` names
            a parameter that no group lists.
    """
    groups = _groups(named_osd, "named_osd")
    ids: dict[Any, int] = {}
    for group in groups:
        group_ids = []
        for name in group.get("params", []):
            ids.setdefault(name, len(ids))
            group_ids.append(ids[name])
        group["params"] = group_ids
    state: dict[int, Any] = {}
    for name, value in named_osd.get("state", {}).items():
        if name not in ids:
            raise ValueError(
                f"named_osd['state'] holds {name!r}, which no parameter group lists "
                f"(groups list {list(ids)}); the state dict is inconsistent."
            )
        state[ids[name]] = value
    return {"state": state, "param_groups": groups}


def to_named_optimizer_state(
    standard_osd: Mapping[str, Any],
    group_names: Sequence[Sequence[str]],
    *,
    where: str = "the optimizer",
) -> dict[str, Any]:
    """Convert an integer-keyed optimizer state dict to the named form.

    Args:
        standard_osd: A state dict keyed by parameter ids, as a plain torch optimizer or a
            trainer's ``optimizer_states`` stores it.
        group_names: For each parameter group of the target optimizer, the names of its
            parameters in group order (see :func:`plain_param_names` for a plain model).
        where: How error messages name the optimizer.

    Returns:
        A new state dict keyed by names (tensors are shared, not copied).

    Raises:
        ValueError: If the number of groups or a group's size differs from ``group_names``.
    """
    groups = _groups(standard_osd, "standard_osd")
    if len(groups) != len(group_names):
        raise ValueError(
            f"The checkpoint's state for {where} has {len(groups)} parameter group(s) but "
            f"the optimizer has {len(group_names)}; create the optimizer with the same "
            f"parameter groups as the one that was saved."
        )
    names: dict[int, str] = {}
    for index, (group, target) in enumerate(zip(groups, group_names, strict=True)):
        saved = list(group.get("params", []))
        if len(saved) != len(target):
            raise ValueError(
                f"Parameter group {index} of {where} does not match the checkpoint: the "
                f"checkpoint's group {index} has {len(saved)} parameter(s), the optimizer's "
                f"has {len(target)} ({list(target)}). Create the optimizer with the same "
                f"parameter groups, in the same order, as the one that was saved."
            )
        names.update(zip(saved, target, strict=True))
        group["params"] = list(target)
    state = {}
    for pid, value in standard_osd.get("state", {}).items():
        if pid not in names:
            raise ValueError(
                f"The checkpoint's state for {where} holds parameter id {pid!r}, which no "
                f"parameter group lists; the state dict is inconsistent."
            )
        state[names[pid]] = value
    return {"state": state, "param_groups": groups}


def check_param_groups(
    named_osd: Mapping[str, Any], group_names: Sequence[Sequence[str]], *, where: str
) -> None:
    """Check that a named optimizer state dict has the optimizer's parameter groups.

    Args:
        named_osd: The checkpoint's optimizer state dict, keyed by names.
        group_names: The names of each of the target optimizer's groups.
        where: How error messages name the optimizer.

    Raises:
        ValueError: Naming the first group whose parameters differ, or the group counts.
    """
    groups = _groups(named_osd, f"The checkpoint's entry for {where}")
    if len(groups) != len(group_names):
        raise ValueError(
            f"The checkpoint's state for {where} has {len(groups)} parameter group(s) but "
            f"the optimizer has {len(group_names)}; create the optimizer with the same "
            f"parameter groups as the one that was saved."
        )
    for index, (group, target) in enumerate(zip(groups, group_names, strict=True)):
        saved = set(group.get("params", []))
        if saved != set(target):
            raise ValueError(
                f"Parameter group {index} of {where} does not match the checkpoint: "
                f"missing from the checkpoint {sorted(set(target) - saved)}, not in the "
                f"optimizer {sorted(saved - set(target))}. Create the optimizer with the "
                f"same parameter groups as the one that was saved."
            )


def plain_param_names(module: nn.Module, optimizer: Optimizer) -> list[list[str]]:
    """The names of each of a plain (unsharded) optimizer's groups, for rekeying.

    Args:
        module: The plain model.
        optimizer: An optimizer over ``module``'s parameters.

    Returns:
        For each group, the names of its parameters in group order.

    Raises:
        ValueError: If the optimizer holds a parameter that ``module`` does not have.
    """
    names = {id(p): n for n, p in module.named_parameters()}
    result = []
    for index, group in enumerate(optimizer.param_groups):
        missing = [i for i, p in enumerate(group["params"]) if id(p) not in names]
        if missing:
            raise ValueError(
                f"Parameter {missing[0]} of group {index} of the optimizer is not a "
                f"parameter of the module; pass the module the optimizer was built for."
            )
        result.append([names[id(p)] for p in group["params"]])
    return result
